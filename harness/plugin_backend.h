// A backend loaded at run time from a shared library through the C plugin ABI
// (include/kvlab/plugin.h): `kvlab check --backend plugin:/path/to/lib.so`.
//
// The library is opened with dlopen(RTLD_NOW | RTLD_LOCAL) and its kvlab_plugin_entry()
// table checked (abi_version == KVLAB_PLUGIN_ABI_VERSION). Any failure to load (no such
// file, not a shared library, no entry symbol, a null table, another ABI version) throws
// Error(invalid_argument) naming the path and the reason.
//
// Memory is host memory (HostMemoryBackend). Each op: a null slot throws
// Error(unsupported) "plugin NAME does not implement the op X"; otherwise the call is
// validated with the oracle's own checks (reference/<stem>.h validate_*, as the SIMD
// backend does) so a plugin rejects the same calls with the same messages and sees only
// valid input, then the operands are marshalled into the C structs and the plugin's
// status mapped to Error (1 unsupported, 2 invalid_argument, other internal) carrying
// the plugin's message.
//
// name() is "plugin:" + path, so reports and repro lines name the backend as the command
// line did (`kvlab repro --backend plugin:PATH '<line>'` reruns verbatim).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "kvlab/host_buffer.h"

struct kvlab_plugin_v1;

namespace kvlab {

class PluginBackend final : public HostMemoryBackend {
 public:
  explicit PluginBackend(std::string_view path);  // throws Error(invalid_argument) when it cannot load
  ~PluginBackend() override;
  PluginBackend(const PluginBackend&) = delete;
  PluginBackend& operator=(const PluginBackend&) = delete;

  std::string name() const override { return "plugin:" + path_; }
  const std::string& plugin_name() const { return plugin_name_; }  // the table's name
  KVLAB_OVERRIDE_ALL_OPS

 private:
  std::string path_;
  std::string plugin_name_;
  void* handle_ = nullptr;
  const kvlab_plugin_v1* table_ = nullptr;
};

std::unique_ptr<Backend> make_plugin_backend(std::string_view path);

}  // namespace kvlab
