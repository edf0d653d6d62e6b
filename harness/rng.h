// Counter-based random fill: element i of tensor `name` in problem `line` is a pure
// function of (line, name, i). No generator state is carried between elements, so a
// fill split across threads, tiles or backends gives the same bits, and the printed
// repro line alone recreates every input.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

namespace kvlab::harness {

constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

class CounterRng {
 public:
  CounterRng(std::string_view case_line, std::string_view tensor_name)
      : key_(splitmix64(fnv1a(case_line) ^ splitmix64(fnv1a(tensor_name)))) {}

  std::uint64_t bits(std::uint64_t i) const { return splitmix64(key_ ^ splitmix64(i)); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform(std::uint64_t i) const { return static_cast<double>(bits(i) >> 11) * 0x1p-53; }
  // Standard normal by Box–Muller over the counters 2i and 2i+1.
  double normal(std::uint64_t i) const {
    const double u1 = 1.0 - uniform(2 * i);  // (0, 1]: log stays finite
    const double u2 = uniform(2 * i + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  std::uint64_t key_;
};

}  // namespace kvlab::harness
