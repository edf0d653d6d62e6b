#version 450
// The decode pass of quantized_sdpa for GPUs: the chunk pass of sdpa_core.glsl (same
// work items, parameter table, partials and combine pass), written for the common
// serving shape and taken by kernels/vulkan/quantized_sdpa.cc only where it applies:
// affine K/V of 2, 4 or 8 bits (codes never straddle a word) in groups of a power of two,
// no mask array (none or causal: the keys a query row may see are one interval, the same
// for every head), Dv·vbits/32 a power of two <= 64, and compute-stage subgroup arithmetic.
//
// Why a second pass: on an NVIDIA H100 the general pass decoded 4-bit attention at
// Lk 65536 at a tiny fraction of the device's copy rate, and this one is several times
// faster, still far from the target (bench/records/2026-11-26-nvidia-h100.md has the
// figures and what is left):
// run-time bit widths and group sizes kept every loop rolled and every code load
// waiting on the one before; V was read one feature per invocation per key, with a
// scale and bias load per feature. Here the bit widths and the heads per workgroup are
// specialization constants (the host builds one pipeline per combination), so the loops
// over a word's codes and over the heads unroll, and:
//   K side: invocation x scores key t0 + x of the 64-key tile for every head of the
//     block, its row read four words at a time (16-byte loads where aligned, the next
//     four in flight while these are used), q (and Σq per group) from shared memory;
//   softmax: the tile's per-head max through subgroupMax and one value per subgroup;
//     each invocation keeps the running Σp of its own keys (summed once per chunk);
//   V side: invocation x owns word x mod VW of the keys x div VW, + 64/VW, … of the
//     tile: one coalesced word load per key (the 64 invocations read 64 consecutive
//     words), four keys' loads issued together, one scale and bias per key and word,
//     32/vbits features of every head
//     accumulated in registers; the invocations that share a word are summed once per
//     chunk through shared memory.
// Two barriers a tile (the per-tile arrays alternate between two copies, so a tile's
// writes never meet the previous tile's reads), none for a tile no row may see.
//
// Numerics as sdpa_core.glsl: the same factored logit Σ_g s_g·Σ q_d c_d + b_g·Σ q_d in
// the same order per key, the same online softmax in f32 (m per tile), V decoded as
// (c·s) + b; only the summation order of l and of the chunk's V accumulators differs.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "affine_common.glsl"
#include "sdpa_math.glsl"
#include "sdpa_params.glsl"

// What the loops unroll over (kernels/vulkan/quantized_sdpa.cc, same order); the head
// dims and group sizes stay run-time values (table), so a lavapipe run compiles one
// pipeline per bit widths and block, not one per shape (each takes lavapipe long to compile).
layout(constant_id = 0) const uint KBITS = 4;
layout(constant_id = 1) const uint VBITS = 4;
layout(constant_id = 2) const uint R = 4;  // room for the heads per workgroup (P_R_BLOCK <= R)

const uint TILE = KVLAB_LOCAL_SIZE;                 // keys per tile
const uint KCPW = 32u / KBITS, VCPW = 32u / VBITS;  // codes per word
const uint KMASK = (1u << KBITS) - 1u, VMASK = (1u << VBITS) - 1u;
#define MAX_SUBGROUPS 16   // TILE / 4: the host requires subgroups of >= 4
#define MAX_R 8            // R <= this
#define MAX_Q_FLOATS 2048  // R·Dk (host: heads_per_workgroup)
#define MAX_K_GROUPS 32    // Dk / K group: Dk <= 1024, groups >= 32

// Bindings as quantized_sdpa.comp: 0 the work buffer, 1 K codes, 2 V codes, 3 mask
// (unread here), 4..7 K scales, K biases, V scales, V biases.
layout(std430, set = 0, binding = 1) readonly buffer kw_block { uint kw[]; };
layout(std430, set = 0, binding = 1) readonly buffer kw4_block { uvec4 kw4[]; };
layout(std430, set = 0, binding = 2) readonly buffer vw_block { uint vw[]; };
#include "sdpa_quantized_meta.glsl"

shared float sh_q[MAX_Q_FLOATS];             // [d][r] (rows >= nr are 0; host: Dk·R <= this)
shared float sh_qsum[MAX_K_GROUPS * R];       // [K group][r]: Σ q
shared float sh_p[2][TILE * R];               // [tile parity][key][r]: softmax weight
shared float sh_sg_max[2][R * MAX_SUBGROUPS];  // [tile parity][r][subgroup]: max score
shared float sh_sg_sum[R * MAX_SUBGROUPS];    // [r][subgroup]: Σ p of the chunk
shared float sh_red[TILE * VCPW];             // one head's V accumulators, every invocation

uint g_dk, g_kgroup, g_kw, g_kgw, g_kg;  // Dk, K group; K words per row, per group; K groups per row
uint g_vw, g_vg, g_vgroup_shift;          // V words per row (a power of two), V groups per row

const float LOWEST = -3.4028234e38;  // below every finite score; visible scores are never −inf

// The keys [lo, hi) row i of batch b may see: reference/mask.h's lower-right aligned
// causal rule (window, left and right paddings) as an interval; every key without a mask.
ivec2 visible_keys(uint b, uint i) {
  const int lk = int(P[P_LK]);
  if (P[P_MASK_KIND] == MASK_NONE) return ivec2(0, lk);
  const int pos = int(i) + lk - int(P[P_LQ]), window = int(P[P_WINDOW]);
  int lo = window > 0 ? pos - window + 1 : 0, hi = min(pos + 1, lk);
  if (P[P_HAS_LPAD] != 0u) lo = max(lo, int(P[P_PADDINGS + b]));
  if (P[P_HAS_RPAD] != 0u) hi = min(hi, lk - int(P[P_PADDINGS + P[P_HAS_LPAD] * P[P_B] + b]));
  return ivec2(max(lo, 0), hi);
}

// Key `row`'s logits for the block's heads: Σ_g s_g·Σ_{d∈g} q_d c_d + b_g·Σ_{d∈g} q_d,
// each code decoded once for every head (the order of sdpa_core.glsl's dot_qk). The row
// is read four words at a time (one 16-byte load where the rows are 16-byte aligned:
// `wide`), the next four loaded before this four's codes are used.
uvec4 k_words(uint base, uint w, bool wide) {
  if (w >= g_kw) return uvec4(0u);
  if (wide) return kw4[(base + w) / 4u];
  return uvec4(kw[base + w], w + 1u < g_kw ? kw[base + w + 1u] : 0u, w + 2u < g_kw ? kw[base + w + 2u] : 0u,
               w + 3u < g_kw ? kw[base + w + 3u] : 0u);
}
void score(uint row, uint k_off, bool wide, out float dot[R]) {
  float part[R];
  [[unroll]] for (uint r = 0u; r < R; ++r) {
    dot[r] = 0.0;
    part[r] = 0.0;
  }
  const uint base = k_off + row * g_kw;
  uint g = 0u, in_group = 0u;  // the group of the next word, and its words summed so far
  uvec4 next = k_words(base, 0u, wide);
  for (uint w0 = 0u; w0 < g_kw; w0 += 4u) {
    const uvec4 four = next;
    next = k_words(base, w0 + 4u, wide);
    [[unroll]] for (uint x = 0u; x < 4u; ++x) {
      if (w0 + x >= g_kw) break;
      [[unroll]] for (uint e = 0u; e < KCPW; ++e) {
        const float cf = float((four[x] >> (e * KBITS)) & KMASK);
        const uint d = (w0 + x) * KCPW + e;
        [[unroll]] for (uint r = 0u; r < R; ++r) part[r] += sh_q[d * R + r] * cf;
      }
      if (++in_group == g_kgw) {  // the end of group g
        const float s = ks_at(g_ks_off + row * g_kg + g), b = kb_at(g_kb_off + row * g_kg + g);
        [[unroll]] for (uint r = 0u; r < R; ++r) {
          dot[r] += s * part[r] + b * sh_qsum[g * R + r];
          part[r] = 0.0;
        }
        ++g;
        in_group = 0u;
      }
    }
  }
}

// Word w of key `row`'s V codes, and the scale and bias of its group.
struct VWord {
  uint codes;
  float s, b;
};
VWord load_v(uint row, uint w, uint v_off) {
  const uint meta = row * g_vg + ((w * VCPW) >> g_vgroup_shift);
  return VWord(vw[v_off + row * g_vw + w], vs_at(g_vs_off + meta), vb_at(g_vb_off + meta));
}
// Its features w·VCPW …: (c·s) + b, as the oracle dequantizes.
void decode_v(VWord x, out float v[VCPW]) {
  [[unroll]] for (uint e = 0u; e < VCPW; ++e) {
    precise float scaled = float((x.codes >> (e * VBITS)) & VMASK) * x.s;
    v[e] = scaled + x.b;
  }
}

// Head r's partial of the chunk (row `row`): m, Σ l over the subgroups (in order), the
// any-visible flag, and the V accumulators staged in sh_red summed over the kps
// invocations that own each word.
void write_partial(uint r, float m_r, uint row, uint chunk, uint chunks, bool seen, uint kps) {
  const uint lid = gl_LocalInvocationID.x;
  const uint base = P[P_PARTIAL_BASE] + (row * chunks + chunk) * (P[P_DV] + PARTIAL_HEADER);
  if (lid == 0u) {
    float total = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; ++g) total += sh_sg_sum[r * MAX_SUBGROUPS + g];
    WF[base] = m_r;
    WF[base + 1u] = total;
    WF[base + 2u] = seen ? 1.0 : 0.0;
  }
  if (lid < g_vw) {
    [[unroll]] for (uint e = 0u; e < VCPW; ++e) {
      float sum = 0.0;
      for (uint k = 0u; k < kps; ++k) sum += sh_red[(k * g_vw + lid) * VCPW + e];
      WF[base + PARTIAL_HEADER + lid * VCPW + e] = sum;
    }
  }
}

void main() {
  load_meta_params();
  g_dk = P[P_DK];
  g_kgroup = P[P_KGROUP];
  g_kw = g_dk / KCPW;
  g_kgw = g_kgroup / KCPW;
  g_kg = g_dk / g_kgroup;
  g_vw = P[P_DV] / VCPW;
  g_vg = P[P_DV] / P[P_VGROUP];
  g_vgroup_shift = uint(findLSB(P[P_VGROUP]));  // group sizes are powers of two
  const uint vw_shift = uint(findLSB(g_vw)), kps = TILE >> vw_shift;  // V: keys per step
  const uint k_off = P[P_K_OFF], v_off = P[P_V_OFF], qf_base = P[P_QF_BASE];
  const uint lid = gl_LocalInvocationID.x, sg = gl_SubgroupID;
  const uint hq = P[P_HQ], hkv = P[P_HKV], lq = P[P_LQ], lk = P[P_LK];
  const uint chunks = P[P_CHUNKS], chunk_len = P[P_CHUNK_LEN];
  const uint group = hq / hkv, r_block = P[P_R_BLOCK], blocks = (group + r_block - 1u) / r_block;
  const uint items = P[P_B] * hkv * blocks * lq * chunks;
  const float scale = uintBitsToFloat(P[P_SCALE]), softcap = uintBitsToFloat(P[P_SOFTCAP]);
  const bool mean_policy = P[P_MEAN_POLICY] != 0u;
  const uint vword = lid & (g_vw - 1u), vkey = lid >> vw_shift;  // the V side's word and first key
  const bool k_wide = (k_off & 3u) == 0u && (g_kw & 3u) == 0u;
  for (uint item = gl_WorkGroupID.x; item < items; item += gl_NumWorkGroups.x) {
    const uint chunk = item % chunks, task = item / chunks;
    const uint i = task % lq, blk = (task / lq) % blocks, kvh = (task / (lq * blocks)) % hkv;
    const uint b = task / (lq * blocks * hkv);
    const uint h0 = kvh * group + blk * r_block, nr = min(r_block, group - blk * r_block);
    const uint kv_row0 = (b * hkv + kvh) * lk;  // key 0 of this kv head
    barrier();  // the previous item is done with the shared arrays
    for (uint x = lid; x < g_dk * R; x += TILE) {
      const uint d = x / R, r = x % R;
      sh_q[x] = r < nr ? WF[qf_base + ((b * hq + h0 + r) * lq + i) * g_dk + d] : 0.0;
    }
    barrier();
    for (uint x = lid; x < g_kg * R; x += TILE) {
      const uint g = x / R, r = x % R;
      float s = 0.0;
      for (uint d = g * g_kgroup; d < (g + 1u) * g_kgroup; ++d) s += sh_q[d * R + r];
      sh_qsum[x] = s;
    }
    barrier();

    float m[MAX_R], l[MAX_R], acc[MAX_R][VCPW];  // heads >= R: never touched (KVLAB_HEAD_PARTIAL)
    [[unroll]] for (uint r = 0u; r < R; ++r) {
      m[r] = 0.0;
      l[r] = 0.0;
      [[unroll]] for (uint e = 0u; e < VCPW; ++e) acc[r][e] = 0.0;
    }
    // This chunk's keys and the visible ones among them (uniform over the workgroup).
    const uint j0 = chunk * chunk_len, j1 = min(lk, j0 + chunk_len);
    const ivec2 vis = visible_keys(b, i);
    const uint lo = uint(clamp(vis.x, int(j0), int(j1))), hi = uint(clamp(vis.y, int(lo), int(j1)));
    const bool seen = lo < hi;
    uint parity = 0u;
    bool had = false;  // an earlier tile of the chunk was scored
    // The tiles that hold a visible key: consecutive, as the visible keys are an interval.
    for (uint t0 = j0 + (lo - j0) / TILE * TILE; t0 < hi; t0 += TILE, parity ^= 1u, had = true) {
      const uint j = t0 + lid;
      const bool mine = j >= lo && j < hi;
      float s[R];
      [[unroll]] for (uint r = 0u; r < R; ++r) s[r] = LOWEST;
      if (mine) {
        float dot[R];
        score(kv_row0 + j, k_off, k_wide, dot);
        [[unroll]] for (uint r = 0u; r < R; ++r) {
          float x = scale * dot[r];
          if (softcap > 0.0) x = softcap * kvlab_tanh(x / softcap);
          s[r] = x;
        }
      }
      [[unroll]] for (uint r = 0u; r < R; ++r) {
        const float sg_max = subgroupMax(s[r]);
        if (subgroupElect()) sh_sg_max[parity][r * MAX_SUBGROUPS + sg] = sg_max;
      }
      barrier();
      [[unroll]] for (uint r = 0u; r < R; ++r) {
        float tile_max = LOWEST;
        for (uint g = 0u; g < gl_NumSubgroups; ++g) tile_max = max(tile_max, sh_sg_max[parity][r * MAX_SUBGROUPS + g]);
        const float m_new = had ? max(m[r], tile_max) : tile_max;
        const float alpha = had ? kvlab_exp(m[r] - m_new) : 0.0;
        m[r] = m_new;
        const float p = mine ? kvlab_exp(s[r] - m_new) : 0.0;
        sh_p[parity][lid * R + r] = p;
        l[r] = l[r] * alpha + p;
        [[unroll]] for (uint e = 0u; e < VCPW; ++e) acc[r][e] *= alpha;
      }
      barrier();
      // Four keys at a time, their loads issued before their arithmetic.
      for (uint u0 = vkey; u0 < TILE; u0 += 4u * kps) {
        VWord x[4];
        [[unroll]] for (uint n = 0u; n < 4u; ++n) {
          const uint u = u0 + n * kps;  // hidden: its V is never read (it may be NaN poison)
          x[n] = u < TILE && t0 + u >= lo && t0 + u < hi ? load_v(kv_row0 + t0 + u, vword, v_off) : VWord(0u, 0.0, 0.0);
        }
        [[unroll]] for (uint n = 0u; n < 4u; ++n) {
          const uint u = u0 + n * kps;
          if (u >= TILE || t0 + u < lo || t0 + u >= hi) continue;
          float v[VCPW];
          decode_v(x[n], v);
          [[unroll]] for (uint r = 0u; r < R; ++r) {
            const float p = sh_p[parity][u * R + r];
            [[unroll]] for (uint e = 0u; e < VCPW; ++e) acc[r][e] += p * v[e];
          }
        }
      }
    }
    if (!seen && mean_policy) {
      // No head sees a key of this chunk: keep the plain sum of its values, which the
      // combine pass uses only when the whole row turns out fully masked (the oracle's
      // mean over all Lk keys, FullyMaskedRow::mean_of_values).
      for (uint jj = j0 + vkey; jj < j1; jj += kps) {
        float v[VCPW];
        decode_v(load_v(kv_row0 + jj, vword, v_off), v);
        [[unroll]] for (uint r = 0u; r < R; ++r) {
          [[unroll]] for (uint e = 0u; e < VCPW; ++e) acc[r][e] += v[e];
        }
      }
    }

    // The chunk's partials: Σ l over the invocations (subgroup order), the V accumulators
    // of the invocations that own the same word, one head at a time.
    [[unroll]] for (uint r = 0u; r < R; ++r) {
      const float sg_sum = subgroupAdd(l[r]);
      if (subgroupElect()) sh_sg_sum[r * MAX_SUBGROUPS + sg] = sg_sum;
    }
    // Head r's V accumulators go through shared memory with a literal r: a loop over the
    // heads with barriers in it stays a loop on NVIDIA's compiler, and indexing acc and m
    // by its counter put them in local memory for the whole kernel (144 bytes a thread,
    // VK_KHR_pipeline_executable_properties on an H100).
#define KVLAB_HEAD_PARTIAL(r)                                                             \
    if (R > r) {                                                                        \
      barrier(); /* sh_red is free (and, the first time, sh_sg_sum is written) */        \
      [[unroll]] for (uint e = 0u; e < VCPW; ++e) sh_red[lid * VCPW + e] = acc[r][e];   \
      barrier();                                                                        \
      if (r < nr) write_partial(r, m[r], (b * hq + h0 + r) * lq + i, chunk, chunks, seen, kps); \
    }
    KVLAB_HEAD_PARTIAL(0)
    KVLAB_HEAD_PARTIAL(1)
    KVLAB_HEAD_PARTIAL(2)
    KVLAB_HEAD_PARTIAL(3)
    KVLAB_HEAD_PARTIAL(4)
    KVLAB_HEAD_PARTIAL(5)
    KVLAB_HEAD_PARTIAL(6)
    KVLAB_HEAD_PARTIAL(7)
  }
}
