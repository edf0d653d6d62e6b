// Device mutants of the bug zoo (compiled only with KVLAB_WITH_VULKAN): mechanisms that
// live in a device kernel sequence rather than behind the Hooks, so each brings its own
// killer properties. Without a usable Vulkan device such a mutant cannot run: the zoo
// reports it SKIPPED with the reason, never killed.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kvlab::prop::zoo {

struct DeviceMutant {
  std::string id;        // short name in the kill matrix
  std::string upstream;  // the upstream bug it reproduces
  // Empty when the mutant can run here, else why not (called once, before the properties).
  std::function<std::string()> unavailable;
  // (name, one RapidCheck case), in the order the zoo tries them.
  std::vector<std::pair<std::string, std::function<void()>>> properties;
};

std::vector<DeviceMutant> device_mutants();

}  // namespace kvlab::prop::zoo
