#include "cache/cell_kv_cache.h"

#include <algorithm>
#include <limits>

#include "kvlab/error.h"

namespace kvlab::cells {
namespace {

std::int32_t lo(std::int32_t p0) { return p0 < 0 ? 0 : p0; }
std::int32_t hi(std::int32_t p1) { return p1 < 0 ? std::numeric_limits<std::int32_t>::max() : p1; }

}  // namespace

CellKVCache::CellKVCache(int layers, std::int64_t kv_heads, std::int64_t head_dim, Positions positions)
    : layers_(layers), width_(kv_heads * head_dim), positions_(positions), k_(static_cast<std::size_t>(layers)),
      v_(static_cast<std::size_t>(layers)) {
  KVLAB_REQUIRE(layers > 0 && kv_heads > 0 && head_dim > 0, invalid_argument, "cell cache of ", layers,
                " layers, ", kv_heads, " kv heads of ", head_dim, ": each must be positive");
}

void CellKVCache::check_seq(int seq, const char* what) const {
  KVLAB_REQUIRE(seq >= 0, invalid_argument, "cell cache ", what, ": sequence ", seq, " < 0");
}

std::int64_t CellKVCache::add_cell(int seq, std::int32_t pos) {
  check_seq(seq, "add_cell");
  KVLAB_REQUIRE(pos >= 0, invalid_argument, "cell cache add_cell: position ", pos, " < 0");
  for (const Cell& c : cells_) {
    const auto it = c.holders.find(seq);
    KVLAB_REQUIRE(it == c.holders.end() || it->second != pos, misuse, "cell cache add_cell: sequence ", seq,
                  " already holds position ", pos);
  }
  Cell c;
  c.holders[seq] = pos;
  cells_.push_back(c);
  for (int l = 0; l < layers_; ++l) {
    k_[static_cast<std::size_t>(l)].resize(cells_.size() * static_cast<std::size_t>(width_));
    v_[static_cast<std::size_t>(l)].resize(cells_.size() * static_cast<std::size_t>(width_));
  }
  return static_cast<std::int64_t>(cells_.size()) - 1;
}

void CellKVCache::set_kv(int layer, std::int64_t cell, std::span<const float> k_raw, std::span<const float> v) {
  KVLAB_REQUIRE(layer >= 0 && layer < layers_, invalid_argument, "cell cache set_kv: layer ", layer, " outside [0, ",
                layers_, ")");
  KVLAB_REQUIRE(cell >= 0 && cell < static_cast<std::int64_t>(cells_.size()), invalid_argument,
                "cell cache set_kv: no cell ", cell);
  KVLAB_REQUIRE(static_cast<std::int64_t>(k_raw.size()) == width_ && static_cast<std::int64_t>(v.size()) == width_,
                shape_mismatch, "cell cache set_kv: rows of ", k_raw.size(), " and ", v.size(), ", expected ", width_);
  const auto at = static_cast<std::size_t>(cell * width_);
  std::copy(k_raw.begin(), k_raw.end(), k_[static_cast<std::size_t>(layer)].begin() + static_cast<std::ptrdiff_t>(at));
  std::copy(v.begin(), v.end(), v_[static_cast<std::size_t>(layer)].begin() + static_cast<std::ptrdiff_t>(at));
}

void CellKVCache::seq_rm(int seq, std::int32_t p0, std::int32_t p1) {
  if (p0 < 0 && p1 < 0) {  // emptied whole: nothing it held is left to taint it
    if (seq < 0) {
      split_taint_.clear();
      div_taint_.clear();
    }
    split_taint_.erase(seq);
    div_taint_.erase(seq);
  }
  for (Cell& c : cells_)
    for (auto it = c.holders.begin(); it != c.holders.end();) {
      const bool match = (seq < 0 || it->first == seq) && it->second >= lo(p0) && it->second < hi(p1);
      it = match ? c.holders.erase(it) : std::next(it);
    }
}

void CellKVCache::seq_cp(int src, int dst, std::int32_t p0, std::int32_t p1) {
  check_seq(src, "seq_cp");
  check_seq(dst, "seq_cp");
  if (src == dst) return;
  for (const Cell& c : cells_) {
    const auto s = c.holders.find(src);
    if (s == c.holders.end() || s->second < lo(p0) || s->second >= hi(p1)) continue;
    for (const Cell& other : cells_) {
      const auto d = other.holders.find(dst);
      KVLAB_REQUIRE(d == other.holders.end() || d->second != s->second, misuse, "cell cache seq_cp(", src, ", ", dst,
                    "): sequence ", dst, " already holds position ", s->second, " (remove it first)");
    }
  }
  for (Cell& c : cells_) {
    const auto s = c.holders.find(src);
    if (s == c.holders.end() || s->second < lo(p0) || s->second >= hi(p1)) continue;
    c.holders[dst] = s->second;
    c.left[dst] = c.left[src];  // a copy of a key that had left the window (note_window)
  }
  if (split_taint_.count(src) != 0) split_taint_.insert(dst);
  if (div_taint_.count(src) != 0) div_taint_.insert(dst);
}

void CellKVCache::seq_keep(int seq) {
  check_seq(seq, "seq_keep");
  const bool split = split_taint_.count(seq) != 0, div = div_taint_.count(seq) != 0;
  split_taint_.clear();
  div_taint_.clear();
  if (split) split_taint_.insert(seq);
  if (div) div_taint_.insert(seq);
  for (Cell& c : cells_)
    for (auto it = c.holders.begin(); it != c.holders.end();) it = it->first != seq ? c.holders.erase(it) : std::next(it);
}

void CellKVCache::move(int seq, std::int32_t p0, std::int32_t p1, bool divide, auto&& new_pos) {
  for (const Cell& c : cells_) {  // refuse before anything moves
    const auto it = c.holders.find(seq);
    if (it == c.holders.end() || it->second < lo(p0) || it->second >= hi(p1)) continue;
    KVLAB_REQUIRE(new_pos(static_cast<std::int64_t>(it->second)) <= std::numeric_limits<std::int32_t>::max(),
                  invalid_argument, "cell cache: sequence ", seq, " position ", it->second, " moved past int32");
  }
  for (Cell& c : cells_) {
    const auto it = c.holders.find(seq);
    if (it == c.holders.end() || it->second < lo(p0) || it->second >= hi(p1)) continue;
    const std::int64_t to = new_pos(static_cast<std::int64_t>(it->second));
    if (to == it->second) continue;
    if (divide)
      for (const auto& holder : c.holders) div_taint_.insert(holder.first);
    if (positions_ == Positions::per_cell) {  // every holder moves, or the cell goes for all
      if (to < 0) c.holders.clear();
      for (auto& holder : c.holders) holder.second = static_cast<std::int32_t>(to);
      continue;
    }
    if (c.holders.size() > 1)  // llama.cpp would move (or drop) every holder
      for (const auto& holder : c.holders) split_taint_.insert(holder.first);
    if (to < 0) c.holders.erase(it);
    else it->second = static_cast<std::int32_t>(to);
  }
}

void CellKVCache::seq_add(int seq, std::int32_t p0, std::int32_t p1, std::int32_t delta) {
  check_seq(seq, "seq_add");
  if (delta == 0 || lo(p0) >= hi(p1)) return;
  move(seq, p0, p1, false, [delta](std::int64_t p) { return p + delta; });
}

void CellKVCache::seq_div(int seq, std::int32_t p0, std::int32_t p1, int d) {
  check_seq(seq, "seq_div");
  KVLAB_REQUIRE(d > 1, invalid_argument, "cell cache seq_div by ", d, ": the divisor must be > 1");
  move(seq, p0, p1, true, [d](std::int64_t p) { return p / d; });
}

void CellKVCache::clear() {
  cells_.clear();
  split_taint_.clear();
  div_taint_.clear();
  for (auto& k : k_) k.clear();
  for (auto& v : v_) v.clear();
}

std::int32_t CellKVCache::pos_min(int seq) const {
  std::int32_t m = -1;
  for (const Cell& c : cells_)
    if (const auto it = c.holders.find(seq); it != c.holders.end() && (m < 0 || it->second < m)) m = it->second;
  return m;
}

std::int32_t CellKVCache::pos_max(int seq) const {
  std::int32_t m = -1;
  for (const Cell& c : cells_)
    if (const auto it = c.holders.find(seq); it != c.holders.end() && it->second > m) m = it->second;
  return m;
}

std::int64_t CellKVCache::entries(int seq) const {
  return std::count_if(cells_.begin(), cells_.end(), [&](const Cell& c) { return c.holders.count(seq) != 0; });
}

std::vector<Visible> CellKVCache::visible(int seq, std::int32_t pos, int window) const {
  std::vector<Visible> out;
  for (std::size_t i = 0; i < cells_.size(); ++i) {
    const auto it = cells_[i].holders.find(seq);
    if (it == cells_[i].holders.end() || it->second > pos) continue;
    if (window > 0 && static_cast<std::int64_t>(pos) - it->second >= window) continue;
    out.push_back({static_cast<std::int64_t>(i), it->second});
  }
  return out;
}

std::span<const float> CellKVCache::k_raw(int layer, std::int64_t cell) const {
  return {k_.at(static_cast<std::size_t>(layer)).data() + cell * width_, static_cast<std::size_t>(width_)};
}

std::span<const float> CellKVCache::v(int layer, std::int64_t cell) const {
  return {v_.at(static_cast<std::size_t>(layer)).data() + cell * width_, static_cast<std::size_t>(width_)};
}

void CellKVCache::note_window(int window) {
  if (window <= 0) return;
  std::map<int, std::int32_t> top;
  for (const Cell& c : cells_)
    for (const auto& [q, p] : c.holders) top[q] = std::max(top.count(q) ? top[q] : -1, p);
  for (Cell& c : cells_)
    for (const auto& [q, p] : c.holders)
      if (static_cast<std::int64_t>(top[q]) + 1 - p >= window) c.left[q] = true;
}

bool CellKVCache::sees_a_key_that_left(int seq, std::int32_t pos, int window) const {
  if (window <= 0) return false;
  for (const Visible& e : visible(seq, pos, window)) {
    const auto& left = cells_[static_cast<std::size_t>(e.cell)].left;
    if (const auto it = left.find(seq); it != left.end() && it->second) return true;
  }
  return false;
}

}  // namespace kvlab::cells
