// A multi-sequence cell cache (docs/semantics.md §Cell cache): llama.cpp's KV cache model,
// as kvlab's oracle defines it. A cell is one token's K (before RoPE) and V for every
// layer; each sequence that holds the cell holds it at a position of its own. The
// sequence verbs (llama.cpp's llama_memory_seq_*) change one sequence's entries only:
// no verb on sequence S changes what sequence T attends to (the isolation invariant).
// Keys are rotated when attended, at the position the sequence holds them at now, so a
// position shift (the K-shift) is exact by construction: RoPE of position p + d is what a
// key computed at p + d gets.
//
// Host memory, f32 in, double arithmetic: the oracle of the llama.cpp replays
// (adapters/llama), not a cache class of the backends.
//
// Errors (kvlab::Error): a sequence id < 0; a K/V row of the wrong width or a layer out of
// range; a token position < 0; a sequence given a second entry at a position it holds
// (seq_cp onto held positions: remove them first); seq_div by d < 2.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <vector>

namespace kvlab::cells {

// One visible key of a query: the cell and the position the querying sequence holds it at.
struct Visible {
  std::int64_t cell = 0;
  std::int32_t pos = 0;
};

// How positions are held: per holder (kvlab's rule, the isolation invariant) or, to model
// llama.cpp's cells exactly, one per cell (a move of one holder moves every holder, and a
// negative position drops the cell for all): the replay's flavour that shows every other
// difference is none (docs/semantics.md §Cell cache).
enum class Positions : std::uint8_t { per_holder, per_cell };

class CellKVCache {
 public:
  CellKVCache(int layers, std::int64_t kv_heads, std::int64_t head_dim, Positions positions = Positions::per_holder);

  // A new cell held by `seq` at `pos`; its K/V rows are written per layer by set_kv.
  std::int64_t add_cell(int seq, std::int32_t pos);
  // k_raw (before RoPE) and v of one cell in one layer: kv_heads·head_dim each.
  void set_kv(int layer, std::int64_t cell, std::span<const float> k_raw, std::span<const float> v);

  // llama_memory_seq_*: positions [p0, p1), p0 < 0 reads 0 and p1 < 0 reads +inf.
  void seq_rm(int seq, std::int32_t p0, std::int32_t p1);   // seq < 0: every sequence
  void seq_cp(int src, int dst, std::int32_t p0, std::int32_t p1);
  void seq_keep(int seq);
  void seq_add(int seq, std::int32_t p0, std::int32_t p1, std::int32_t delta);  // < 0 afterwards: dropped
  void seq_div(int seq, std::int32_t p0, std::int32_t p1, int d);
  void clear();

  std::int32_t pos_min(int seq) const;  // -1 when the sequence holds nothing
  std::int32_t pos_max(int seq) const;
  std::int64_t entries(int seq) const;  // how many cells the sequence holds

  // What a query of `seq` at `pos` attends to: the sequence's entries at positions ≤ pos,
  // and, with window > 0, pos − p < window (a sliding layer), in cell order.
  std::vector<Visible> visible(int seq, std::int32_t pos, int window) const;
  std::span<const float> k_raw(int layer, std::int64_t cell) const;
  std::span<const float> v(int layer, std::int64_t cell) const;

  // Taints the replays read to explain a finding (sticky until the sequence is emptied
  // whole by seq_rm(seq, -1, -1) or dropped by seq_keep of another, and passed on by
  // seq_cp, since every later token of a tainted sequence was computed from what it held):
  // split: llama.cpp keeps one position per cell for all its holders, so a shift or
  // division of one holder moves (or drops) them all; the sequence held a cell whose
  // holders kvlab moved apart, where kvlab's isolation and llama.cpp's shared position
  // part. divided: the sequence held a cell whose position seq_div changed.
  bool holds_a_split_cell(int seq) const { return split_taint_.count(seq) != 0; }
  bool holds_a_divided_cell(int seq) const { return div_taint_.count(seq) != 0; }

  // llama.cpp's sliding-window cache treats a cell as free once its sequence's next
  // position no longer sees it (pos_max + 1 − pos ≥ window) and may reuse it, purging the
  // sequence's positions up to it; a later seq_rm of the tail or a shift can bring such a
  // position back into a query's window. note_window marks, for every holder, the keys
  // that have left its window so far (sticky); sees_a_key_that_left says whether a query
  // of `seq` at `pos` sees one in a layer of that window. kvlab keeps every key.
  void note_window(int window);
  bool sees_a_key_that_left(int seq, std::int32_t pos, int window) const;

  std::int64_t width() const { return width_; }

 private:
  struct Cell {
    std::map<int, std::int32_t> holders;  // sequence -> position
    std::map<int, bool> left;             // holder -> its key left the holder's window (note_window)
  };
  void check_seq(int seq, const char* what) const;
  void move(int seq, std::int32_t p0, std::int32_t p1, bool divide, auto&& new_pos);

  int layers_;
  std::int64_t width_;
  Positions positions_;
  std::vector<Cell> cells_;
  std::set<int> split_taint_, div_taint_;
  std::vector<std::vector<float>> k_, v_;  // per layer: cells × width
};

}  // namespace kvlab::cells
