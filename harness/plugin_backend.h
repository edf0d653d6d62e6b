// A backend loaded at run time from a shared library through the C plugin ABI
// (include/kvlab/plugin.h): `kvlab check --backend plugin:/path/to/lib.so`.
//
// The library is opened with dlopen(RTLD_NOW | RTLD_LOCAL) and its kvlab_plugin_entry()
// table checked (abi_version == KVLAB_PLUGIN_ABI_VERSION). Any failure to load (no such
// file, not a shared library, no entry symbol, a null table, another ABI version) throws
// Error(invalid_argument) naming the path and the reason.
//
// Memory is host memory (HostMemoryBackend). Each op with a slot (KVLAB_PLUGIN_OPS): a
// null slot throws Error(unsupported) "plugin NAME does not implement the op X"; otherwise the call is
// validated with the oracle's own checks (reference/<stem>.h validate_*, as the SIMD
// backend does) so a plugin rejects the same calls with the same messages and sees only
// valid input, then the operands are marshalled into the C structs and the plugin's
// status mapped to Error (1 unsupported, 2 invalid_argument, other internal) carrying
// the plugin's message.
//
// Crash isolation (docs/plugins.md): by default every plugin call runs in a forked child
// (harness/isolated_call.h) over buffers shared with it, under a watchdog, so a plugin
// that crashes or hangs fails that case (Error{device}: the signal, or the time limit)
// and the run goes on. Flags after the path: `,timeout=SECONDS` (default 60) and
// `,inprocess` (no child: faster, but a crash ends kvlab).
//
// name() is "plugin:" + the variant, so reports and repro lines name the backend as the
// command line did (`kvlab repro --backend plugin:PATH '<line>'` reruns verbatim).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "harness/isolated_call.h"
#include "kvlab/host_buffer.h"

struct kvlab_plugin_v1;

namespace kvlab {

// X(op, ArgumentStruct): the ops of kvlab/op_list.h the plugin ABI carries, one slot
// each in kvlab_plugin_v1, in this order (plugin_backend.cc checks the table against
// this list at compile time, and `override` checks each entry against KVLAB_OPS). An op
// added to KVLAB_OPS has no slot until the ABI grows one (a slot appended to the table,
// KVLAB_PLUGIN_ABI_VERSION bumped, an entry here): until then a plugin does not offer it
// and the op throws Backend's Error{unsupported} naming it.
#define KVLAB_PLUGIN_OPS(X)                  \
  X(quantize, QuantizeArgs)                  \
  X(dequantize, DequantizeArgs)              \
  X(rope, RopeArgs)                          \
  X(sdpa, SdpaArgs)                          \
  X(quantized_sdpa, QuantizedSdpaArgs)       \
  X(turboquant_encode, TurboQuantEncodeArgs) \
  X(turboquant_decode, TurboQuantDecodeArgs) \
  X(kv_scatter, KvScatterArgs)               \
  X(kv_gather, KvGatherArgs)                 \
  X(kv_copy_blocks, KvCopyBlocksArgs)        \
  X(kv_roll, KvRollArgs)                     \
  X(kv_append_advance, KvAppendAdvanceArgs)  \
  X(kv_snapshot, KvSnapshotArgs)

class PluginBackend final : public HostMemoryBackend {
 public:
  // "PATH[,inprocess][,timeout=SECONDS]"; throws Error(invalid_argument) when it cannot load.
  explicit PluginBackend(std::string_view variant);
  ~PluginBackend() override;
  PluginBackend(const PluginBackend&) = delete;
  PluginBackend& operator=(const PluginBackend&) = delete;

  std::string name() const override { return "plugin:" + variant_; }
  using HostMemoryBackend::allocate;
  BufferPtr allocate(std::size_t bytes) override;
  const std::string& plugin_name() const { return plugin_name_; }  // the table's name
#define KVLAB_PLUGIN_OP(op, Args) void op(const Args& a) override;
  KVLAB_PLUGIN_OPS(KVLAB_PLUGIN_OP)
#undef KVLAB_PLUGIN_OP

 private:
  std::string variant_, path_;
  std::string plugin_name_;
  Isolation isolation_;
  void* handle_ = nullptr;
  const kvlab_plugin_v1* table_ = nullptr;
};

std::unique_ptr<Backend> make_plugin_backend(std::string_view variant);

}  // namespace kvlab
