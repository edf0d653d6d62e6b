// The backend registry: names → factories.
//
// "reference" is built in. A backend name may carry a variant after a colon
// ("simd:AVX3", "vulkan:1"); the part before the colon selects the entry and the rest
// is handed to its factory.
//
// How optimized backends register (no static-initializer tricks: objects in a static
// library that nothing references are dropped by the linker, and the registration with
// them):
//  * SIMD (kernels/simd): expose `std::unique_ptr<Backend> make_simd_backend(std::string_view
//    target)` and `std::vector<std::string> simd_targets()` (every attainable Highway
//    target, so `kvlab check --backend simd:<T>` can test each, not just the best). Then
//    in harness/CMakeLists.txt: `if(TARGET kvlab_simd)` link it and define
//    KVLAB_HAVE_SIMD; backends.cc adds the "simd" entry under that macro.
//  * Vulkan (kernels/vulkan): the same with KVLAB_HAVE_VULKAN and "vulkan[:device]"; a
//    missing device makes the factory throw Error(unsupported), which `kvlab check`
//    reports as every case UNIMPLEMENTED with the reason, not as a failure.
//  * Tests register wrappers at run time with register_backend() (e.g. the deliberately
//    wrong kernel of tests/harness).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvlab/backend.h"

namespace kvlab::harness {

struct BackendEntry {
  std::string name;         // before the colon
  std::string target;       // device / ISA description for reports ("host scalar, f64 accumulation")
  std::string description;
  std::function<std::unique_ptr<Backend>(std::string_view variant)> make;
};

// Throws Error(invalid_argument) naming the unknown backend and listing the known ones.
std::unique_ptr<Backend> make_backend(std::string_view name);
// The report target of a backend name ("reference" → its entry's target; a variant is
// appended: "simd:AVX3" → "<target> AVX3").
std::string backend_target(std::string_view name);
std::vector<BackendEntry> backend_entries();
void register_backend(BackendEntry entry);  // replaces an entry of the same name

}  // namespace kvlab::harness
