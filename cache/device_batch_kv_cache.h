// DeviceBatchKVCache(left_padding): BatchKVCache's layout (B rows right-aligned at one
// shared column cursor, per-row left padding) with the per-row offsets held in a backend
// tensor, as an engine keeps them on its device (docs/lifecycle.md §Offset snapshot, the
// offset-aliasing hazard).
//
// Writes go through kv_append_advance, which reads each row's offset where it lives and
// advances it there (reference/kv_append.h). The host keeps only the shared cursor, to
// size the buffers and check capacity before anything is recorded; offsets() downloads
// the device tensor, so what the observables report is what the kernels produced.
//
// Its positions stay where its offsets are: snapshot_positions() copies the live offsets
// into a new backend tensor (kv_snapshot) before attend() appends, and both RoPEs read that
// copy, so no step reads the offsets back to the host. Roping at the live tensor instead
// would give positions S too far once the append has advanced it (mlx-lm#1097 / #1806,
// vlm#966; docs/lifecycle.md §Offset snapshot).
//
// Not a full BatchKVCache: no prepare/finalize/filter/extend and no trim (the offsets
// would need device-side rewinds that no engine step performs); those verbs are a
// misuse naming the class.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/cache.h"

namespace kvlab {

class DeviceBatchKVCache final : public Cache {
 public:
  static constexpr std::int64_t kStep = 256;

  // left_padding: one entry >= 0 per row (B >= 1); row b's offset starts at −left_padding[b].
  DeviceBatchKVCache(Backend& backend, std::vector<std::int32_t> left_padding);

  std::string_view class_name() const override { return "DeviceBatchKVCache"; }
  // Appends k (B, H, S, Dk) and v (B, H, S, Dv) at each row's device offset and advances it.
  FetchedKV update(const DTensor& k, const DTensor& v) override;

  std::int64_t kv_length() const override { return idx_; }
  std::vector<std::int32_t> offsets() const override;  // downloaded from the device tensor
  // A copy of the live offsets made in backend memory (kv_snapshot); batch must be B.
  DTensor snapshot_positions(std::int64_t batch) const override;
  CacheMask make_mask(std::int64_t n, int window) const override;
  bool is_trimmable() const override { return false; }
  std::int64_t trim(std::int64_t) override { return 0; }
  bool empty() const override { return keys_.buffer == nullptr; }
  std::size_t nbytes() const override;
  std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const override;
  std::vector<BackingBuffer> buffers() const override;
  CacheState state() const override;
  static std::unique_ptr<DeviceBatchKVCache> from_state(Backend& backend, const CacheState& state);

  std::int64_t batch_size() const { return static_cast<std::int64_t>(left_padding_.size()); }
  std::int64_t idx() const { return idx_; }
  std::int64_t capacity() const { return empty() ? 0 : keys_.shape[2]; }
  const std::vector<std::int32_t>& left_padding() const { return left_padding_; }
  // Columns [0, idx) of the buffers, (B, H, idx, D) each.
  FetchedKV fetch() const;

 private:
  void check_chunk(const DTensor& k, const DTensor& v) const;

  std::vector<std::int32_t> left_padding_;
  std::int64_t idx_ = 0;  // columns written, shared by every row
  DTensor keys_, values_;
  DTensor live_;  // i32 (B,): the offsets the kernels read and advance
};

}  // namespace kvlab
