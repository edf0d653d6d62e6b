// The machine's arithmetic ceiling, measured in the same process and run as the kernels,
// for the roofline column of tools/bench_table.py: f32 fused multiply-adds per second on
// the best attainable Highway target (the widest vector FMA: every kernel's f32 path is
// built on it), over the SIMD kernels' worker pool like the memory baselines. A kernel
// that needs F f32 multiply-adds per byte cannot move more than (FMA lanes per second)/F
// bytes per second, whatever the memory allows: attention at R query heads per kv head
// needs R·(Dk + Dv) per key row of (Dk + Dv) elements.
#pragma once

#include <cstdint>
#include <string>

namespace kvlab::bench {

// Runs `rounds` rounds of independent FMA chains on each of the pool's workers (use_pool)
// or on the calling thread alone; returns the f32 lanes multiplied-and-added.
double fma_lanes(std::int64_t rounds, bool use_pool);

// The dot-product instructions the decode kernels use beside FMAs (simd::ArithmeticMix),
// timed the same way on 512-bit vectors: vdpbf16ps (AVX512_BF16; each lane adds two bf16
// products), vpdpbusd (AVX512_VNNI; four u8·s8 products) and vpdpwssd (AVX512_VNNI; two
// s16·s16 products: the integer V side); and the tile multiply
// tdpbsud (AMX-INT8, granted by the OS), whose lanes are C's i32 elements times A's
// dwords (four u8·s8 products each, as vpdpbusd's), on whole 16×64-byte tiles. A
// kernel's arithmetic floor is then its FMA lanes over the FMA rate plus its dot lanes
// over these rates. s16_madd: AVX2's vpmaddwd + vpaddd on 256-bit vectors (two s16·s16
// products a lane, as vpdpwssd's), the integer ceiling of CPUs without VNNI; no kernel
// declares it yet, so it prices no row and stands beside baseline_fma in the table.
enum class DotKind { bf16, u8, amx_int8, s16, s16_madd };
// Why this CPU (or build) cannot time `kind`; empty when it can.
std::string dot_unavailable(DotKind kind);
// Lanes computed by `rounds` rounds of independent chains per worker (or the caller);
// throws kvlab::Error (unsupported) with dot_unavailable's reason where it is not empty.
double dot_lanes(DotKind kind, std::int64_t rounds, bool use_pool);

}  // namespace kvlab::bench
