#include "harness/plugin_backend.h"

#include <dlfcn.h>

#include <array>
#include <cstddef>
#include <iterator>
#include <cstdlib>
#include <cstring>

#include "harness/isolated_call.h"
#include "kvlab/error.h"
#include "kvlab/plugin.h"
#include "reference/attention_operands.h"
#include "reference/affine_quantize.h"
#include "reference/fp_quantize.h"
#include "reference/ggml_quantize.h"
#include "reference/kv_append.h"
#include "reference/kv_move.h"
#include "reference/quantize.h"
#include "reference/quantized_sdpa.h"
#include "reference/rope.h"
#include "reference/sdpa.h"
#include "reference/turboquant.h"

namespace kvlab {

namespace {

// The C ABI spells kvlab's enums as integers and the marshalling casts them: each
// constant must keep the value of its enumerator, or a reorder of an enum would silently
// hand a plugin another dtype, format or mask.
template <class E>
constexpr int value_of(E e) {
  return static_cast<int>(e);
}
static_assert(KVLAB_DTYPE_F32 == value_of(DType::f32) && KVLAB_DTYPE_F16 == value_of(DType::f16) &&
              KVLAB_DTYPE_BF16 == value_of(DType::bf16) && KVLAB_DTYPE_U32 == value_of(DType::u32) &&
              KVLAB_DTYPE_I32 == value_of(DType::i32) && KVLAB_DTYPE_U8 == value_of(DType::u8));
static_assert(KVLAB_QUANT_AFFINE == value_of(QuantMode::affine) && KVLAB_QUANT_MXFP4 == value_of(QuantMode::mxfp4) &&
              KVLAB_QUANT_MXFP8 == value_of(QuantMode::mxfp8) && KVLAB_QUANT_NVFP4 == value_of(QuantMode::nvfp4));
static_assert(KVLAB_QUANT_Q8_0 == value_of(QuantMode::q8_0) && KVLAB_QUANT_Q4_0 == value_of(QuantMode::q4_0) &&
              KVLAB_QUANT_Q4_1 == value_of(QuantMode::q4_1) && KVLAB_QUANT_Q5_0 == value_of(QuantMode::q5_0) &&
              KVLAB_QUANT_Q5_1 == value_of(QuantMode::q5_1) && KVLAB_QUANT_IQ4_NL == value_of(QuantMode::iq4_nl));
static_assert(KVLAB_ROUNDING_MLX_CPU == value_of(Rounding::mlx_cpu) &&
              KVLAB_ROUNDING_MLX_GPU == value_of(Rounding::mlx_gpu) && KVLAB_ROUNDING_MLX == value_of(Rounding::mlx) &&
                  KVLAB_ROUNDING_GGML_REF == value_of(Rounding::ggml_ref) &&
                  KVLAB_ROUNDING_GGML_CPU == value_of(Rounding::ggml_cpu));
static_assert(KVLAB_MASK_NONE == value_of(MaskKind::none) && KVLAB_MASK_CAUSAL == value_of(MaskKind::causal) &&
              KVLAB_MASK_BOOLEAN == value_of(MaskKind::boolean) && KVLAB_MASK_ADDITIVE == value_of(MaskKind::additive));
static_assert(KVLAB_FULLY_MASKED_ZERO == value_of(FullyMaskedRow::zero) &&
              KVLAB_FULLY_MASKED_MEAN_OF_VALUES == value_of(FullyMaskedRow::mean_of_values));

// The slot table is the plugin's op list (KVLAB_PLUGIN_OPS, each entry a KVLAB_OPS op)
// in C: a slot named after every listed op, in the list's order, one after another, and
// no slot more. A slot added to the table without its list entry, or the reverse, fails
// here; so does a reorder, which would hand a plugin's function the wrong arguments.
#define KVLAB_PLUGIN_SLOT_OFFSET(op, Args) offsetof(kvlab_plugin_v1, op),
constexpr std::size_t kSlotOffsets[] = {KVLAB_PLUGIN_OPS(KVLAB_PLUGIN_SLOT_OFFSET)};
#undef KVLAB_PLUGIN_SLOT_OFFSET
constexpr bool slots_follow_the_op_list() {
  constexpr std::size_t slot = sizeof(kvlab_plugin_v1::quantize);
  for (std::size_t i = 0; i < std::size(kSlotOffsets); ++i)
    if (kSlotOffsets[i] != kSlotOffsets[0] + i * slot) return false;
  return sizeof(kvlab_plugin_v1) == kSlotOffsets[0] + std::size(kSlotOffsets) * slot;
}
static_assert(slots_follow_the_op_list(), "kvlab_plugin_v1's slots must be KVLAB_OPS, in order");

// ---- marshalling: kvlab views -> the C structs of kvlab/plugin.h --------------------

kvlab_tensor c_tensor(const ConstTensorView& v) {
  KVLAB_REQUIRE(v.rank() <= KVLAB_PLUGIN_MAX_RANK, unsupported, "the plugin ABI carries tensors of rank <= ",
                KVLAB_PLUGIN_MAX_RANK, ", got shape ", shape_str(v.shape));
  kvlab_tensor t{};
  t.data = const_cast<std::byte*>(v.data);  // inputs are documented read-only
  t.dtype = static_cast<std::int32_t>(v.dtype);
  t.rank = v.rank();
  for (std::size_t i = 0; i < v.shape.size(); ++i) t.shape[i] = v.shape[i];
  return t;
}

template <class View>
kvlab_quantized c_quantized(const View& q) {
  kvlab_quantized c{};
  c.wq = c_tensor(q.wq);
  c.scales = c_tensor(q.scales);
  c.biases = c_tensor(q.biases);  // data == nullptr when the format has none
  c.mode = static_cast<std::int32_t>(q.spec.mode);
  c.bits = q.spec.bits;
  c.group_size = q.spec.group_size;
  c.has_global_scale = q.global_scale.has_value() ? 1 : 0;
  c.global_scale = q.global_scale.value_or(0.0f);
  return c;
}

kvlab_attention_params c_attention(const AttentionParams& p) {
  kvlab_attention_params c{};
  c.scale = p.scale;
  c.softcap = p.softcap;
  c.mask_kind = static_cast<std::int32_t>(p.mask.kind);
  c.window = p.mask.window;
  c.left_padding = p.mask.left_padding.empty() ? nullptr : p.mask.left_padding.data();
  c.left_padding_count = static_cast<std::int64_t>(p.mask.left_padding.size());
  c.right_padding = p.mask.right_padding.empty() ? nullptr : p.mask.right_padding.data();
  c.right_padding_count = static_cast<std::int64_t>(p.mask.right_padding.size());
  c.fully_masked = static_cast<std::int32_t>(p.fully_masked);
  return c;
}

kvlab_turboquant_codec c_codec(const TurboQuantCodec& codec) {
  kvlab_turboquant_codec c{};
  c.dim = codec.dim;
  c.bits = codec.bits;
  c.signs = codec.signs.empty() ? nullptr : codec.signs.data();
  c.signs_count = static_cast<std::int64_t>(codec.signs.size());
  c.rotation = codec.rotation.empty() ? nullptr : codec.rotation.data();
  c.rotation_count = static_cast<std::int64_t>(codec.rotation.size());
  c.codebook = codec.codebook.empty() ? nullptr : codec.codebook.data();
  c.codebook_count = static_cast<std::int64_t>(codec.codebook.size());
  c.channels = codec.channels.empty() ? nullptr : codec.channels.data();
  c.channels_count = static_cast<std::int64_t>(codec.channels.size());
  return c;
}

// An optional operand: nullptr stays nullptr, else `storage` holds the C tensor.
const kvlab_tensor* c_optional(const ConstTensorView* v, kvlab_tensor& storage) {
  if (v == nullptr) return nullptr;
  storage = c_tensor(*v);
  return &storage;
}

// ---- calling ------------------------------------------------------------------------

template <class Fn>
void require_slot(Fn fn, const std::string& plugin, const char* op) {
  KVLAB_REQUIRE(fn != nullptr, unsupported, "plugin ", plugin, " does not implement the op ", op);
}

template <class Fn, class Args>
void call(Fn fn, const Args& args, const std::string& plugin, const char* op, const Isolation& isolation) {
  std::array<char, 1024> msg{};
  const auto body = [&](char* text, std::size_t cap) { return fn(&args, text, cap); };
  const std::int32_t status =
      isolation.enabled ? run_isolated(body, msg.data(), msg.size(), isolation.timeout_seconds,
                                       cat("plugin ", plugin, " op ", op))
                        : body(msg.data(), msg.size());
  if (status == KVLAB_PLUGIN_OK) return;
  msg.back() = '\0';
  const std::string text = msg[0] != '\0' ? cat(": ", msg.data()) : std::string(" (no message)");
  switch (status) {
    case KVLAB_PLUGIN_UNSUPPORTED: fail(ErrorKind::unsupported, cat("plugin ", plugin, " op ", op, " unsupported", text));
    case KVLAB_PLUGIN_INVALID: fail(ErrorKind::invalid_argument, cat("plugin ", plugin, " op ", op, " rejected the input", text));
    default: fail(ErrorKind::internal, cat("plugin ", plugin, " op ", op, " failed with status ", status, text));
  }
}

// The moves that take (src, a host index vector, dst) — scatter, gather, roll — differ
// only in their validator and argument struct.
template <class CArgs, class Fn, class Validate>
void call_move(Fn fn, const std::string& plugin, const Isolation& isolation, const char* op, const DTensor& src_t,
               const ConstTensorView& index, const DTensor& dst_t, Validate validate) {
  require_slot(fn, plugin, op);
  const ConstTensorView src = host_cview(src_t);
  const TensorView dst = host_view(dst_t);
  validate(src, index, dst);
  const kvlab_tensor cs = c_tensor(src), ci = c_tensor(index), cd = c_tensor(dst);
  const CArgs args{&cs, &ci, &cd};
  call(fn, args, plugin, op, isolation);
}

std::string dl_reason() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("unknown dlerror");
}

// "PATH[,inprocess][,timeout=SECONDS]": the flags are the trailing comma-separated
// words that are flags; everything before them is the path.
void parse_plugin_variant(std::string_view variant, std::string& path, Isolation& isolation) {
  path = std::string(variant);
  for (;;) {
    const std::size_t comma = path.rfind(',');
    if (comma == std::string::npos) return;
    const std::string flag = path.substr(comma + 1);
    if (flag == "inprocess") {
      isolation.enabled = false;
    } else if (flag.rfind("timeout=", 0) == 0) {
      const std::string value = flag.substr(8);
      char* end = nullptr;
      const double seconds = std::strtod(value.c_str(), &end);
      KVLAB_REQUIRE(!value.empty() && end == value.c_str() + value.size() && seconds > 0 && seconds <= 86400,
                    invalid_argument, "plugin flag '", flag, "': the timeout must be seconds in (0, 86400]");
      isolation.timeout_seconds = seconds;
    } else {
      return;  // part of the path
    }
    path.erase(comma);
  }
}

}  // namespace

PluginBackend::PluginBackend(std::string_view variant) : variant_(variant) {
  parse_plugin_variant(variant, path_, isolation_);
  KVLAB_REQUIRE(!path_.empty(), invalid_argument,
                "backend 'plugin' needs the path of a shared library: --backend plugin:/path/to/libkernels.so");
  dlerror();
  handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  KVLAB_REQUIRE(handle_ != nullptr, invalid_argument, "cannot load plugin ", path_, ": ", dl_reason());
  try {
    dlerror();
    void* sym = dlsym(handle_, KVLAB_PLUGIN_ENTRY_SYMBOL);
    KVLAB_REQUIRE(sym != nullptr, invalid_argument, "plugin ", path_, " has no entry point ",
                  KVLAB_PLUGIN_ENTRY_SYMBOL, " (not a kvlab plugin?): ", dl_reason());
    kvlab_plugin_entry_fn entry = nullptr;
    static_assert(sizeof entry == sizeof sym);
    std::memcpy(&entry, &sym, sizeof entry);  // object pointer -> function pointer, as POSIX allows
    if (isolation_.enabled) {
      // A library whose entry point crashes is named here, before kvlab calls it itself.
      char unused[1];
      (void)run_isolated([&](char*, std::size_t) { return entry() != nullptr ? 0 : 1; }, unused, sizeof unused,
                         isolation_.timeout_seconds, cat("plugin ", path_, ": ", KVLAB_PLUGIN_ENTRY_SYMBOL, "()"));
    }
    table_ = entry();
    KVLAB_REQUIRE(table_ != nullptr, invalid_argument, "plugin ", path_, ": ", KVLAB_PLUGIN_ENTRY_SYMBOL,
                  "() returned a null table");
    KVLAB_REQUIRE(table_->abi_version == KVLAB_PLUGIN_ABI_VERSION, invalid_argument, "plugin ", path_,
                  " was built for plugin ABI version ", table_->abi_version, ", this kvlab speaks version ",
                  KVLAB_PLUGIN_ABI_VERSION, " (rebuild it against include/kvlab/plugin.h)");
    plugin_name_ = table_->name != nullptr && table_->name[0] != '\0' ? table_->name : path_;
  } catch (...) {
    dlclose(handle_);
    throw;
  }
}

PluginBackend::~PluginBackend() {
  if (handle_ != nullptr) dlclose(handle_);
}

BufferPtr PluginBackend::allocate(std::size_t bytes) {
  return isolation_.enabled ? make_shared_host_buffer(bytes) : HostMemoryBackend::allocate(bytes);
}

void PluginBackend::quantize(const QuantizeArgs& a) {
  require_slot(table_->quantize, plugin_name_, "quantize");
  const ConstTensorView x = host_cview(a.x);
  const QuantizedMutView out = host_view(a.out);
  ref::validate_format_operands(out.spec, out.biases, out.global_scale, "quantize");
  ref::validate_rounding(out.spec, a.rounding, "quantize");
  switch (out.spec.format().encoder) {
    case QuantEncoder::affine: ref::validate_affine_quantize(x, out.spec, out.wq, out.scales, out.biases); break;
    case QuantEncoder::fp: ref::validate_fp_quantize(x, out.spec, out.global_scale, out.wq, out.scales); break;
    case QuantEncoder::ggml: ref::validate_ggml_quantize(x, out.spec, out.wq, out.scales, out.biases); break;
  }
  const kvlab_tensor cx = c_tensor(x);
  const kvlab_quantized cout = c_quantized(out);
  const kvlab_quantize_args args{&cx, static_cast<std::int32_t>(a.rounding), &cout};
  call(table_->quantize, args, plugin_name_, "quantize", isolation_);
}

void PluginBackend::dequantize(const DequantizeArgs& a) {
  require_slot(table_->dequantize, plugin_name_, "dequantize");
  const QuantizedView in = host_cview(a.in);
  const TensorView out = host_view(a.out);
  ref::validate_format_operands(in.spec, in.biases, in.global_scale, "dequantize");
  ref::validate_rounding(in.spec, a.flavour, "dequantize");
  switch (in.spec.format().encoder) {
    case QuantEncoder::affine: ref::validate_affine_dequantize(in.wq, in.scales, in.biases, in.spec, out); break;
    case QuantEncoder::fp: ref::validate_fp_dequantize(in.wq, in.scales, in.spec, in.global_scale, out); break;
    case QuantEncoder::ggml: ref::validate_ggml_dequantize(in.wq, in.scales, in.biases, in.spec, out); break;
  }
  const kvlab_quantized cin = c_quantized(in);
  const kvlab_tensor cout = c_tensor(out);
  const kvlab_dequantize_args args{&cin, &cout, static_cast<std::int32_t>(a.flavour)};
  call(table_->dequantize, args, plugin_name_, "dequantize", isolation_);
}

void PluginBackend::rope(const RopeArgs& a) {
  require_slot(table_->rope, plugin_name_, "rope");
  const ConstTensorView x = host_cview(a.x);
  const std::optional<ConstTensorView> per_row = host_per_row(a.offsets);
  const TensorView out = host_view(a.out);
  ref::validate_rope(x, a.params, a.offsets.scalar, per_row, out);
  const kvlab_tensor cx = c_tensor(x), cout = c_tensor(out);
  kvlab_tensor cper_row{};
  kvlab_rope_args args{};
  args.x = &cx;
  args.dims = a.params.dims;
  args.traditional = a.params.traditional ? 1 : 0;
  args.base = a.params.base;
  args.scale = a.params.scale;
  args.freqs = a.params.freqs.empty() ? nullptr : a.params.freqs.data();
  args.freqs_count = static_cast<std::int64_t>(a.params.freqs.size());
  args.mlx_arithmetic = a.params.mlx_arithmetic ? 1 : 0;
  args.offset = a.offsets.scalar;
  args.per_row_offsets = c_optional(per_row ? &*per_row : nullptr, cper_row);
  args.out = &cout;
  call(table_->rope, args, plugin_name_, "rope", isolation_);
}

void PluginBackend::sdpa(const SdpaArgs& a) {
  require_slot(table_->sdpa, plugin_name_, "sdpa");
  const ref::SdpaOperands o(a);  // host views, validated by the oracle's checks
  const ConstTensorView &q = o.q, &k = o.k, &v = o.v;
  const TensorView& out = o.out;
  const ConstTensorView *mask = o.mask, *sinks = o.sinks;
  const kvlab_tensor cq = c_tensor(q), ck = c_tensor(k), cv = c_tensor(v), cout = c_tensor(out);
  kvlab_tensor cm{}, cs{};
  const kvlab_attention_params params = c_attention(a.params);
  const kvlab_sdpa_args args{&cq, &ck, &cv, &params, c_optional(mask, cm), c_optional(sinks, cs), &cout};
  call(table_->sdpa, args, plugin_name_, "sdpa", isolation_);
}

void PluginBackend::quantized_sdpa(const QuantizedSdpaArgs& a) {
  require_slot(table_->quantized_sdpa, plugin_name_, "quantized_sdpa");
  const ref::QuantizedSdpaOperands o(a);  // host views, validated by the oracle's checks
  const ConstTensorView& q = o.q;
  const QuantizedView &k = o.k, &v = o.v;
  const TensorView& out = o.out;
  const ConstTensorView *mask = o.mask, *sinks = o.sinks;
  const kvlab_tensor cq = c_tensor(q), cout = c_tensor(out);
  const kvlab_quantized ck = c_quantized(k), cv = c_quantized(v);
  kvlab_tensor cm{}, cs{};
  const kvlab_attention_params params = c_attention(a.params);
  const kvlab_quantized_sdpa_args args{&cq, &ck, &cv, &params, c_optional(mask, cm), c_optional(sinks, cs), &cout};
  call(table_->quantized_sdpa, args, plugin_name_, "quantized_sdpa", isolation_);
}

// TurboQuant has no separate validator in the oracle beyond the codec's; the dtypes are
// checked here, the shapes are left to the plugin (it may return KVLAB_PLUGIN_INVALID).
void PluginBackend::turboquant_encode(const TurboQuantEncodeArgs& a) {
  require_slot(table_->turboquant_encode, plugin_name_, "turboquant_encode");
  const ConstTensorView x = host_cview(a.x);
  const TensorView norms = host_view(a.norms), indices = host_view(a.indices);
  require_float(x, "turboquant_encode x");
  require_dtype(norms, DType::f16, "turboquant_encode norms");
  require_dtype(indices, DType::u32, "turboquant_encode indices");
  ref::validate_turboquant_codec(a.codec, x.dim(-1));
  const kvlab_tensor cx = c_tensor(x), cn = c_tensor(norms), ci = c_tensor(indices);
  const kvlab_turboquant_codec codec = c_codec(a.codec);
  const kvlab_turboquant_encode_args args{&cx, &codec, &cn, &ci};
  call(table_->turboquant_encode, args, plugin_name_, "turboquant_encode", isolation_);
}

void PluginBackend::turboquant_decode(const TurboQuantDecodeArgs& a) {
  require_slot(table_->turboquant_decode, plugin_name_, "turboquant_decode");
  const ConstTensorView norms = host_cview(a.norms), indices = host_cview(a.indices);
  const TensorView out = host_view(a.out);
  require_dtype(norms, DType::f16, "turboquant_decode norms");
  require_dtype(indices, DType::u32, "turboquant_decode indices");
  require_float(out, "turboquant_decode out");
  ref::validate_turboquant_codec(a.codec, out.dim(-1));
  const kvlab_tensor cn = c_tensor(norms), ci = c_tensor(indices), cout = c_tensor(out);
  const kvlab_turboquant_codec codec = c_codec(a.codec);
  const kvlab_turboquant_decode_args args{&cn, &ci, &codec, &cout};
  call(table_->turboquant_decode, args, plugin_name_, "turboquant_decode", isolation_);
}

void PluginBackend::kv_scatter(const KvScatterArgs& a) {
  call_move<kvlab_kv_scatter_args>(table_->kv_scatter, plugin_name_, isolation_, "kv_scatter", a.src, a.slots, a.dst,
                                   ref::validate_kv_scatter);
}

void PluginBackend::kv_gather(const KvGatherArgs& a) {
  call_move<kvlab_kv_gather_args>(table_->kv_gather, plugin_name_, isolation_, "kv_gather", a.src, a.batch_index, a.dst,
                                  ref::validate_kv_gather);
}

void PluginBackend::kv_copy_blocks(const KvCopyBlocksArgs& a) {
  require_slot(table_->kv_copy_blocks, plugin_name_, "kv_copy_blocks");
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  ref::validate_kv_copy_blocks(src, a.blocks, dst);
  static_assert(sizeof(kvlab_seq_block) == sizeof(SeqBlock));
  std::vector<kvlab_seq_block> blocks;
  blocks.reserve(a.blocks.size());
  for (const SeqBlock& b : a.blocks) blocks.push_back({b.src_batch, b.src_seq, b.dst_batch, b.dst_seq, b.length});
  const kvlab_tensor cs = c_tensor(src), cd = c_tensor(dst);
  const kvlab_kv_copy_blocks_args args{&cs, blocks.empty() ? nullptr : blocks.data(),
                                       static_cast<std::int64_t>(blocks.size()), &cd};
  call(table_->kv_copy_blocks, args, plugin_name_, "kv_copy_blocks", isolation_);
}

void PluginBackend::kv_roll(const KvRollArgs& a) {
  call_move<kvlab_kv_roll_args>(table_->kv_roll, plugin_name_, isolation_, "kv_roll", a.src, a.shifts, a.dst,
                                ref::validate_kv_roll);
}

void PluginBackend::kv_append_advance(const KvAppendAdvanceArgs& a) {
  require_slot(table_->kv_append_advance, plugin_name_, "kv_append_advance");
  const ConstTensorView k = host_cview(a.k), v = host_cview(a.v);
  const TensorView offsets = host_view(a.offsets), k_cache = host_view(a.k_cache), v_cache = host_view(a.v_cache);
  ref::validate_kv_append_advance(k, v, a.left_padding, offsets, k_cache, v_cache);
  const kvlab_tensor ck = c_tensor(k), cv = c_tensor(v), cl = c_tensor(a.left_padding), co = c_tensor(offsets),
                     ckc = c_tensor(k_cache), cvc = c_tensor(v_cache);
  const kvlab_kv_append_advance_args args{&ck, &cv, &cl, &co, &ckc, &cvc};
  call(table_->kv_append_advance, args, plugin_name_, "kv_append_advance", isolation_);
}

void PluginBackend::kv_snapshot(const KvSnapshotArgs& a) {
  require_slot(table_->kv_snapshot, plugin_name_, "kv_snapshot");
  const ConstTensorView src = host_cview(a.src);
  const TensorView dst = host_view(a.dst);
  ref::validate_kv_snapshot(src, dst);
  const kvlab_tensor cs = c_tensor(src), cd = c_tensor(dst);
  const kvlab_kv_snapshot_args args{&cs, &cd};
  call(table_->kv_snapshot, args, plugin_name_, "kv_snapshot", isolation_);
}

std::unique_ptr<Backend> make_plugin_backend(std::string_view variant) { return std::make_unique<PluginBackend>(variant); }

}  // namespace kvlab
