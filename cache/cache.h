// The cache types' common vocabulary (docs/semantics.md §Common rules). Every cache is written once
// over a Backend&: bookkeeping (offsets, padding, ring cursor, capacity) lives here on the
// host, the data lives in the backend's buffers and is moved by its kernels
// (reference/kv_move.h). A cache over the ReferenceBackend is the reference cache.
//
// Rules every cache type follows (docs/design.md §Observables):
// - offsets() returns a value snapshot; no API hands out a mutable handle to an offset
//   (docs/lifecycle.md §Offset snapshot, mlx-lm#1097 / #1848). Positions for a chunk are read
//   before update.
// - update() is the plain path and update_quantized() the quantized path; calling the
//   wrong one is a kvlab::Error of kind misuse, never a crash (mlx-swift-lm#71).
// - Unused and evicted slots hold NaN poison so that a read of them fails loudly.
// - Invalid use throws kvlab::Error and leaves the cache exactly as it was.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/backend.h"

namespace kvlab {

// What attention reads after an update: (B, H, L, Dk) keys and (B, H, L, Dv) values,
// fresh tensors owned by the caller. Their key order is the cache's physical order for
// a single-token rotating update (attention does not depend on key order) and temporal
// order otherwise.
struct FetchedKV {
  DTensor keys, values;
  std::int64_t length() const { return keys.shape.empty() ? 0 : keys.shape[2]; }
};

struct FetchedQuantizedKV {
  QuantizedDTensor keys, values;  // codes (B,H,L,words), scales/biases (B,H,L,groups)
  std::int64_t length() const { return keys.wq.shape.empty() ? 0 : keys.wq.shape[2]; }
};

// The mask attention must use with the K/V the coming update will return. It is built
// before the update from pre-update state (docs/lifecycle.md §Mask before the update): either no
// mask, the structured causal form, or an explicit boolean array of shape (1|B, 1, N, L).
struct CacheMask {
  MaskSpec spec;                // kind none, causal or boolean
  std::optional<Tensor> array;  // set iff spec.kind == MaskKind::boolean
};

// Serialized form of one cache: tensors plus string metadata, written to safetensors by
// cache/state_file.h. Every field the cache needs to continue is in here (the mlx-lm
// round trips that lose fields, docs/upstream-bugs.md §U4, §U5, §U6, are not reproduced).
struct CacheState {
  std::string class_name;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;
};

// ---- reading a state's meta (from_state): every failure is `corrupt` and names the cache
// (`who`), the field and the text found.
const std::string& meta_field(const CacheState& st, const char* who, const std::string& field);
// An integer field within [min, max] (a count, a size, an offset: min 0 by default).
std::int64_t meta_integer(const CacheState& st, const char* who, const std::string& field, std::int64_t min = 0,
                          std::int64_t max = INT64_MAX);
// An enumerated field: `parse` maps the text to its value and throws kvlab::Error otherwise.
template <class Parse>
auto meta_enum(const CacheState& st, const char* who, const std::string& field, Parse parse) {
  const std::string& text = meta_field(st, who, field);
  try {
    return parse(text);
  } catch (const Error& e) {
    fail(ErrorKind::corrupt, cat(who, " state field '", field, "': ", e.what()));
  }
}
// A rank-1 i32 tensor holding `v` (per-sequence offsets and padding in a state).
Tensor i32_tensor(const std::vector<std::int32_t>& v);

// ---- observables (docs/design.md §Observables, item 2) ------------------------------------------
// What a cache holds, read without knowing its type: harness scripts, properties and the
// zoo compare these with a model, so no consumer rebuilds them through a cast.

// One named block of a sequence's content: (b, H, L, W), its L tokens oldest first.
struct ContentPart {
  std::string name;
  DTensor rows;  // empty (no buffer) when the sequence holds no token
};

// One sequence's logical content: the tokens attention may see, in temporal order, with
// the absolute position of each. A single-sequence cache has one (its b is the batch
// dimension B, all rows sharing one offset); a batch cache has one per row (b = 1).
// Part names: plain "keys", "values"; affine / fp "keys.wq", "keys.scales",
// ["keys.biases"], then the same for values; TurboQuant "keys.norms", "keys.indices"
// (split bits: "keys.low.*", "keys.high.*"), then values. These are the names of the
// serialized state's tensors, so content and state describe the same thing.
struct SequenceContent {
  std::vector<std::int32_t> positions;
  std::vector<ContentPart> parts;
  std::optional<QuantSpec> spec;  // affine / fp caches: how the parts are packed
  // The part named `name`; throws invalid_argument naming the parts present.
  const DTensor& part(std::string_view name) const;
};

// stored: the parts as the cache keeps them (codes for packed caches). decoded: the float
// rows attention reads, "keys" and "values" — the same as stored except for TurboQuant,
// whose attention reads its decoded codes (quantized attention reads codes directly, so
// affine / fp caches stay packed). Decoding costs a full pass over the content.
enum class ContentForm : std::uint8_t { stored, decoded };

// One buffer of the cache's own storage (not a copy), (B, H, capacity, W): rows
// [0, used) along axis 2 may hold data, the rest must be poison. For poison and guard
// checks; what attention sees is content().
class BatchCache;

struct BackingBuffer {
  std::string name;  // as the content part it backs ("keys", "values.scales", ...)
  DTensor buffer;
  std::int64_t used = 0;
};

class Cache {
 public:
  explicit Cache(Backend& backend) : backend_(&backend) {}
  virtual ~Cache() = default;
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  virtual std::string_view class_name() const = 0;
  virtual bool is_quantized() const { return false; }
  Backend& backend() const { return *backend_; }

  // Stores k (B, H, S, Dk) and v (B, H, S, Dv), advances the offsets by S and returns
  // what attention reads. Plain caches only.
  virtual FetchedKV update(const DTensor& k, const DTensor& v);
  // The same for quantized caches: k/v are float; the result is packed.
  virtual FetchedQuantizedKV update_quantized(const DTensor& k, const DTensor& v);

  // Number of key rows the cache currently holds for attention (uniform accessor for
  // plain and quantized caches, mlx-vlm#1481).
  virtual std::int64_t kv_length() const = 0;
  // Per-sequence offsets (the next real position of each row), by value. Size 1 for
  // single-sequence caches.
  virtual std::vector<std::int32_t> offsets() const = 0;
  // The positions of the next token of each of `batch` rows, as an i32 (batch,) tensor on
  // the cache's backend: a copy taken now, which nothing the cache does later changes
  // (docs/lifecycle.md §Offset snapshot). attend() takes it before the update and ropes Q
  // and K at it. The default uploads offsets(), one entry repeated for every row of a
  // single-sequence cache; a cache whose offsets live in backend memory copies them there,
  // so no step reads them back to the host.
  virtual DTensor snapshot_positions(std::int64_t batch) const;
  // The mask for an update of n tokens, from the pre-update state. window 0 = none.
  virtual CacheMask make_mask(std::int64_t n, int window) const = 0;

  virtual bool is_trimmable() const = 0;
  // Removes up to n newest tokens; returns how many were removed.
  virtual std::int64_t trim(std::int64_t n) = 0;
  virtual bool empty() const = 0;
  // Exact bytes of everything the cache holds in backend memory (packed data + scales +
  // biases + capacity slack); no hidden copies exist.
  virtual std::size_t nbytes() const = 0;

  virtual CacheState state() const = 0;

  // The logical content, one entry per offsets() entry (see SequenceContent).
  virtual std::vector<SequenceContent> content(ContentForm form = ContentForm::stored) const = 0;
  // The backing buffers; none while the cache has allocated nothing.
  virtual std::vector<BackingBuffer> buffers() const = 0;

  // ---- what only some kinds have: a default that says "not this kind" -----------------
  // The batch verbs (cache/batch_cache.h); nullptr for a cache without them.
  virtual BatchCache* batch() { return nullptr; }
  virtual const BatchCache* batch() const { return nullptr; }
  // What besides the class decides the tokens and bits the cache stores ("max_size:8
  // keep:4", a QuantSpec and rounding); empty when nothing does. Keys that must not mix
  // states are built from it (the prefix cache's CacheFormat).
  virtual std::string parameters() const { return {}; }
  // mlx-lm's to_quantized: a quantized cache with the same offset and capacity, or nullptr
  // for a kind with no quantized form (docs/lifecycle.md §Quantization policy).
  virtual std::unique_ptr<Cache> quantized_form(const QuantSpec&, Rounding) const { return nullptr; }
  // llama4's maybe_trim_front before every attention (docs/semantics.md §Chunked cache);
  // true for a kind that has a front to trim, which the other kinds do not.
  virtual bool maybe_trim_front() { return false; }

 protected:
  Backend* backend_;
};

// The content of a single-sequence cache whose `length` tokens are the newest ones,
// ending at `offset`, as the named (B, H, length, W) parts.
SequenceContent newest_content(std::int64_t offset, std::int64_t length, std::vector<ContentPart> parts);
// Plain parts "keys", "values" of fetched K/V.
std::vector<ContentPart> plain_parts(const FetchedKV& kv);
// Packed parts "keys.wq", ... of fetched codes (biases only where the QuantSpec has them).
std::vector<ContentPart> packed_parts(const FetchedQuantizedKV& kv);

// NaN bit pattern of a float dtype, used to poison unused slots.
std::uint32_t nan_poison_bits(DType dtype);

}  // namespace kvlab
