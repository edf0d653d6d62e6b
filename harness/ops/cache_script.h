// The cache op (harness/ops/cache_info.cc) runs scripts of the one cache command language,
// which lives with the caches (cache/cache_script.h) so that properties, the CLI and the
// harness share it; the harness's code names it harness::cache_script.
#pragma once

#include "cache/cache_script.h"

namespace kvlab::harness {
namespace cache_script = kvlab::cache_script;
}  // namespace kvlab::harness
