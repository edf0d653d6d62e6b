// CellKVCache (docs/semantics.md §Cell cache): llama.cpp's multi-sequence cell cache as
// kvlab's oracle defines it. Expected positions are worked out from the semantics by hand
// (each test says how), never read back from the class.
#include <gtest/gtest.h>

#include <limits>

#include "cache/cell_kv_cache.h"
#include "kvlab/error.h"

namespace kvlab::cells {
namespace test_cell_kv_cache {

// The positions `seq` attends to from `pos` (no window), in cell order.
std::vector<std::int32_t> seen(const CellKVCache& c, int seq, std::int32_t pos, int window = 0) {
  std::vector<std::int32_t> out;
  for (const Visible& v : c.visible(seq, pos, window)) out.push_back(v.pos);
  return out;
}

CellKVCache with_prompt(int seq, int n, Positions p = Positions::per_holder) {
  CellKVCache c(1, 1, 2, p);
  for (int i = 0; i < n; ++i) c.add_cell(seq, i);
  return c;
}

TEST(CellKVCache, RangesAreHalfOpenWithOpenEnds) {
  CellKVCache c = with_prompt(0, 6);
  c.seq_rm(0, 1, 3);  // removes 1, 2
  EXPECT_EQ(seen(c, 0, 100), (std::vector<std::int32_t>{0, 3, 4, 5}));
  c.seq_rm(0, 4, -1);  // [4, inf)
  EXPECT_EQ(seen(c, 0, 100), (std::vector<std::int32_t>{0, 3}));
  c.seq_rm(0, -1, 1);  // [0, 1)
  EXPECT_EQ(seen(c, 0, 100), (std::vector<std::int32_t>{3}));
  EXPECT_EQ(c.pos_min(0), 3);
  EXPECT_EQ(c.pos_max(0), 3);
  c.seq_rm(0, -1, -1);
  EXPECT_EQ(c.pos_max(0), -1);
  EXPECT_EQ(c.entries(0), 0);
}

TEST(CellKVCache, AQueryOnlySeesItsSequenceUpToItsPositionAndWithinTheWindow) {
  CellKVCache c = with_prompt(0, 10);
  c.add_cell(1, 0);
  EXPECT_EQ(seen(c, 1, 9), (std::vector<std::int32_t>{0}));
  EXPECT_EQ(seen(c, 0, 4), (std::vector<std::int32_t>{0, 1, 2, 3, 4}));
  // Window 3 at position 9: 9 - p < 3, so 7, 8, 9.
  EXPECT_EQ(seen(c, 0, 9, 3), (std::vector<std::int32_t>{7, 8, 9}));
}

TEST(CellKVCache, AShiftOfTheSourceLeavesTheCopyWherePerHolder) {
  CellKVCache c = with_prompt(0, 6);
  c.seq_cp(0, 1, 2, 5);            // sequence 1: 2, 3, 4
  c.seq_add(0, 3, -1, 10);         // sequence 0: 0 1 2 13 14 15
  EXPECT_EQ(seen(c, 0, 100), (std::vector<std::int32_t>{0, 1, 2, 13, 14, 15}));
  EXPECT_EQ(seen(c, 1, 100), (std::vector<std::int32_t>{2, 3, 4}));  // isolation
  EXPECT_TRUE(c.holds_a_split_cell(1));  // cells 3 and 4 are held apart now
  EXPECT_TRUE(c.holds_a_split_cell(0));
  c.seq_add(0, -1, 1, -5);         // position 0 goes negative: dropped, for 0 only
  EXPECT_EQ(c.pos_min(0), 1);
}

TEST(CellKVCache, PerCellPositionsMoveEveryHolderAsLlamaCppDoes) {
  CellKVCache c = with_prompt(0, 6, Positions::per_cell);
  c.seq_cp(0, 1, 2, 5);
  c.seq_add(0, 3, -1, 10);
  EXPECT_EQ(seen(c, 1, 100), (std::vector<std::int32_t>{2, 13, 14}));
  EXPECT_FALSE(c.holds_a_split_cell(1));  // nothing held apart: one position per cell
  c.seq_add(0, -1, 3, -2);  // 0, 1 go negative and 2 -> 0: the shared cell 2 moves for 1 too
  EXPECT_EQ(seen(c, 1, 100), (std::vector<std::int32_t>{0, 13, 14}));
  EXPECT_EQ(seen(c, 0, 100), (std::vector<std::int32_t>{0, 13, 14, 15}));
}

TEST(CellKVCache, DivisionIsIntegerDivisionOfTheRange) {
  CellKVCache c = with_prompt(0, 8);
  c.seq_div(0, 2, 7, 2);  // 2..6 -> 1 1 2 2 3; 0, 1 and 7 stay
  EXPECT_EQ(seen(c, 0, 100), (std::vector<std::int32_t>{0, 1, 1, 1, 2, 2, 3, 7}));
  EXPECT_TRUE(c.holds_a_divided_cell(0));
  EXPECT_FALSE(c.holds_a_split_cell(0));
}

TEST(CellKVCache, TaintsPassByCopyAndEndWhenTheSequenceIsEmptiedWhole) {
  CellKVCache c = with_prompt(0, 4);
  c.seq_cp(0, 1, -1, -1);
  c.seq_add(0, -1, -1, 3);
  c.seq_cp(1, 2, -1, -1);
  EXPECT_TRUE(c.holds_a_split_cell(2));
  c.seq_rm(2, 0, 2);  // partial: still tainted (its later tokens saw the moved keys)
  EXPECT_TRUE(c.holds_a_split_cell(2));
  c.seq_rm(2, -1, -1);
  EXPECT_FALSE(c.holds_a_split_cell(2));
  c.seq_keep(1);
  EXPECT_TRUE(c.holds_a_split_cell(1));
  EXPECT_FALSE(c.holds_a_split_cell(0));
}

TEST(CellKVCache, KeysThatLeftTheWindowAreNotedAndFollowACopy) {
  CellKVCache c = with_prompt(0, 6);  // window 4: pos_max 5, so 0, 1, 2 (5 + 1 - p >= 4) left
  c.note_window(4);
  c.seq_rm(0, 3, -1);  // back to 0 1 2: a query at 3 sees 0..3 again
  EXPECT_TRUE(c.sees_a_key_that_left(0, 3, 4));
  EXPECT_FALSE(c.sees_a_key_that_left(0, 3, 0));
  c.seq_cp(0, 1, -1, -1);
  EXPECT_TRUE(c.sees_a_key_that_left(1, 3, 4));
}

TEST(CellKVCache, MisuseIsAnErrorNamingIt) {
  CellKVCache c = with_prompt(0, 3);
  EXPECT_THROW(c.add_cell(0, 1), Error);       // position 1 already held
  EXPECT_THROW(c.add_cell(-1, 0), Error);
  EXPECT_THROW(c.add_cell(0, -2), Error);
  c.add_cell(1, 1);
  EXPECT_THROW(c.seq_cp(0, 1, -1, -1), Error);  // sequence 1 holds position 1
  EXPECT_THROW(c.seq_div(0, -1, -1, 1), Error);
  EXPECT_THROW(c.set_kv(0, 0, std::vector<float>(3), std::vector<float>(2)), Error);
  EXPECT_THROW(c.set_kv(1, 0, std::vector<float>(2), std::vector<float>(2)), Error);
  EXPECT_THROW(CellKVCache(0, 1, 1), Error);
  try {
    c.seq_add(0, -1, -1, std::numeric_limits<std::int32_t>::max());
    FAIL() << "a position past int32 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int32"), std::string::npos) << e.what();
  }
  EXPECT_EQ(seen(c, 0, 100), (std::vector<std::int32_t>{0, 1, 2}));  // nothing moved
}

}  // namespace test_cell_kv_cache
}  // namespace kvlab::cells
