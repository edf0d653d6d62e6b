// The attention pass shared by sdpa.comp and quantized_sdpa.comp (KVLAB_QUANTIZED):
// flash-decoding. One workgroup per (batch, kv head, block of up to 8 of its R query
// heads, query position, KV chunk): the block's q rows are staged in shared memory and
// every K and V element loaded (and, packed, decoded) once serves all the heads of the
// block (GQA sharing). Keys are scored a tile of KVLAB_LOCAL_SIZE at a time (one key per
// invocation, for every head; visibility first, so a key no head of the block may see
// is never read), and an online softmax in f32 keeps per head (m, l, acc[Dv]) with acc
// spread over the invocations (feature c belongs to invocation c mod 64). Each
// workgroup writes one partial (m, l, any, acc) per head; sdpa_combine.comp merges the
// chunks, adds the sink and normalizes.
//
// Two builds (the host picks one per device, kernels/vulkan/sdpa.cc):
//   KVLAB_SUBGROUP=0 (sdpa.comp, quantized_sdpa.comp): the fallback. Every invocation
//     walks the tile's scores in shared memory for the per-head max and keep flags, and
//     a key's packed codes are read by the one invocation that scores it.
//   KVLAB_SUBGROUP=1 (sdpa_subgroup.comp, sdpa_quantized_subgroup.comp): the tile's
//     keep flags, per-head max and per-head sum go through subgroupOr/Max/Add, then
//     across subgroups through one shared value per subgroup (summed in subgroup order,
//     so the result is deterministic); a tile no head may see is skipped before any K
//     is read. Packed K codes are staged coalesced (dot_qk_staged). Needs compute-stage
//     subgroup arithmetic and a subgroup size in [4, 64] dividing KVLAB_LOCAL_SIZE.
// V is read coalesced in both: invocation c decodes feature c of a key, so consecutive
// invocations read the same or consecutive code words (and share the group's scale).
#ifndef KVLAB_SUBGROUP
#define KVLAB_SUBGROUP 0
#endif
#if KVLAB_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#include "common.glsl"
#include "affine_common.glsl"
#include "sdpa_math.glsl"
#include "sdpa_params.glsl"

#define KVLAB_MAX_R 8              // heads per workgroup
#define KVLAB_Q_SHARED 2048        // floats of staged q, R_BLOCK·Dk (host: R_BLOCK = min(8, R, 2048/Dk))
#define KVLAB_DV_PER_INVOCATION 8  // Dv <= 512

// Bindings: 0 the work buffer (sdpa_params.glsl); float K/V: 1 q, 2 k, 3 v, 4 mask;
// packed K/V: 1 K codes, 2 V codes, 3 mask, 4..7 K scales, K biases, V scales, V biases
// (q was staged into the work buffer as f32 by sdpa_stage_q.comp).
#if KVLAB_QUANTIZED
layout(std430, set = 0, binding = 1) readonly buffer kw_block { uint kw[]; };
layout(std430, set = 0, binding = 2) readonly buffer vw_block { uint vw[]; };
KVLAB_TENSOR16(mask, 3)
#include "sdpa_quantized_meta.glsl"
#else
KVLAB_TENSOR16(q, 1)
KVLAB_TENSOR16(k, 2)
KVLAB_TENSOR16(v, 3)
KVLAB_TENSOR16(mask, 4)
#endif

shared float sh_q[KVLAB_Q_SHARED];                  // [r][d]
shared float sh_qsum[KVLAB_Q_SHARED / 32];           // quantized: [r][K group] Σ q
shared float sh_p[KVLAB_MAX_R * KVLAB_LOCAL_SIZE];   // [r][key of the tile]: score, then weight
shared uint sh_keep[KVLAB_LOCAL_SIZE];               // bit r: the tile's key is visible to head r
#if KVLAB_SUBGROUP
#define KVLAB_MAX_SUBGROUPS 16  // KVLAB_LOCAL_SIZE / 4: the host requires subgroups of >= 4
shared uint sh_sg_keep[KVLAB_MAX_SUBGROUPS];                 // [subgroup]: OR of its keys' flags
shared float sh_sg_max[KVLAB_MAX_R * KVLAB_MAX_SUBGROUPS];   // [r][subgroup]: max visible score
shared float sh_sg_sum[KVLAB_MAX_R * KVLAB_MAX_SUBGROUPS];   // [r][subgroup]: Σ weights
#endif

// x / n for a run-time n, as a shift when n is a power of two (shift = pow2_shift(n)):
// integer division is a long instruction sequence on GPUs.
uint pow2_shift(uint n) { return (n & (n - 1u)) == 0u ? uint(findLSB(n)) : 32u; }
uint divide(uint x, uint n, uint shift) { return shift < 32u ? x >> shift : x / n; }

// The parameters the per-key code reads, loaded from the table once per invocation
// (load_hot_params, first thing in main). Read through P[] in the loops, they were global
// loads again after every barrier() (the table shares its buffer with the partials the
// shader writes); on an NVIDIA H100 the decode ran at a tiny fraction of the device's copy
// rate (bench/records/2026-11-26-nvidia-h100.md).
uint g_dk, g_dv, g_k_off, g_v_off;
#if KVLAB_QUANTIZED
uint g_kbits, g_kgroup, g_vbits, g_vgroup;  // (dtypes and meta offsets: sdpa_quantized_meta.glsl)
uint g_vgroup_shift;                        // pow2_shift(V group size)
#else
uint g_k_dtype, g_v_dtype;
#endif
void load_hot_params() {
  g_dk = P[P_DK];
  g_dv = P[P_DV];
  g_k_off = P[P_K_OFF];
  g_v_off = P[P_V_OFF];
#if KVLAB_QUANTIZED
  load_meta_params();
  g_kbits = P[P_KBITS];
  g_kgroup = P[P_KGROUP];
  g_vbits = P[P_VBITS];
  g_vgroup = P[P_VGROUP];
  g_vgroup_shift = pow2_shift(g_vgroup);
#else
  g_k_dtype = P[P_K_DTYPE];
  g_v_dtype = P[P_V_DTYPE];
#endif
}
#if KVLAB_QUANTIZED
float q_at(uint i) { return WF[P[P_QF_BASE] + i]; }  // staged, already f32 (row-major from 0)
#else
float q_at(uint i) {
  const uint dt = P[P_Q_DTYPE];
  return dt == DT_F32 ? uintBitsToFloat(q_load32(P[P_Q_OFF] + i)) : load_float16(q_load16(P[P_Q_OFF] + i), dt);
}
#endif
float mask_at(uint i) {
  const uint dt = P[P_MASK_DTYPE];
  return dt == DT_F32 ? uintBitsToFloat(mask_load32(i)) : load_float16(mask_load16(i), dt);
}
uint mask_byte(uint i) { return (mask_w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }

#if KVLAB_QUANTIZED
// Code e of the packed row starting at word `base` (a code may straddle two words).
#define KVLAB_CODE_AT(words, base, e, bits)                                   \
  {                                                                           \
    const uint bit_ = (e) * (bits), w_ = (base) + (bit_ >> 5), sh_ = bit_ & 31u; \
    code = words[w_] >> sh_;                                                  \
    if (sh_ + (bits) > 32u) code |= words[w_ + 1u] << (32u - sh_);            \
    code &= (1u << (bits)) - 1u;                                              \
  }

// <q_r, k_j> for the block's heads r < nr, with k = s·c + b per group:
// Σ_g s_g·Σ_{d∈g} q_d c_d + b_g·Σ_{d∈g} q_d; each code is decoded once for every head.
void dot_qk(uint key_row, uint nr, out float dot[KVLAB_MAX_R]) {
  const uint bits = g_kbits, gs = g_kgroup, dk = g_dk, groups = dk / gs;
  const uint base = g_k_off + key_row * (dk * bits / 32u), meta = key_row * groups;
  [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) dot[r] = 0.0;
  for (uint g = 0u; g < groups; ++g) {
    float part[KVLAB_MAX_R];
    [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) part[r] = 0.0;
    for (uint d = g * gs; d < (g + 1u) * gs; ++d) {
      uint code;
      KVLAB_CODE_AT(kw, base, d, bits)
      const float cf = float(code);
      [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
        if (r < nr) part[r] += sh_q[r * dk + d] * cf;
      }
    }
    const float s = ks_at(g_ks_off + meta + g), b = kb_at(g_kb_off + meta + g);
    [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
      if (r < nr) dot[r] += s * part[r] + b * sh_qsum[r * groups + g];
    }
  }
}
float v_at(uint key_row, uint c) {
  const uint bits = g_vbits, gs = g_vgroup, dv = g_dv;
  uint code;
  KVLAB_CODE_AT(vw, g_v_off + key_row * (dv * bits / 32u), c, bits)
  const uint meta = key_row * divide(dv, gs, g_vgroup_shift) + divide(c, gs, g_vgroup_shift);
  precise float scaled = float(code) * vs_at(g_vs_off + meta);
  return scaled + vb_at(g_vb_off + meta);
}
#if KVLAB_SUBGROUP
// dot_qk for every key of the tile at once, with the tile's K codes read coalesced: the
// rows are staged through shared memory a slice at a time, a slice being codes [d0, d1)
// of every key (multiples of 32 codes, i.e. whole words, as group sizes are >= 32), at
// most KVLAB_K_SLICE_WORDS words per key. Invocation x loads word x % sw of key x / sw,
// so consecutive invocations read consecutive words of a key's row (the whole tile is
// one contiguous block when a row fits a slice), and only keys some head may see are
// read. Each invocation then scores its own key from the staged slice (rows padded to
// an odd stride against bank conflicts), with the same operations in the same order
// as dot_qk. Called by the whole workgroup (barriers); `mine`: this key is visible.
#define KVLAB_K_SLICE_WORDS 16u
#define KVLAB_K_STRIDE 17u
shared uint sh_kw[KVLAB_LOCAL_SIZE * KVLAB_K_STRIDE];
void dot_qk_staged(uint tile_row0, bool mine, uint nr, out float dot[KVLAB_MAX_R]) {
  const uint lid = gl_LocalInvocationID.x;
  const uint bits = g_kbits, gs = g_kgroup, dk = g_dk, groups = dk / gs, row_words = dk * bits / 32u;
  const uint slice_codes = 32u * (KVLAB_K_SLICE_WORDS / bits), meta = (tile_row0 + lid) * groups;
  float part[KVLAB_MAX_R];
  [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
    dot[r] = 0.0;
    part[r] = 0.0;
  }
  uint g = 0u, in_group = 0u;  // the group of code d, and how many of its codes are summed
  for (uint d0 = 0u; d0 < dk; d0 += slice_codes) {
    const uint d1 = min(dk, d0 + slice_codes), w0 = d0 * bits / 32u, sw = (d1 - d0) * bits / 32u;
    const uint sw_shift = pow2_shift(sw);  // word x of the slice belongs to key x / sw
    barrier();  // the previous slice has been consumed
    for (uint x = lid; x < KVLAB_LOCAL_SIZE * sw; x += KVLAB_LOCAL_SIZE) {
      const uint key = divide(x, sw, sw_shift), w = x - key * sw;
      if (sh_keep[key] != 0u) sh_kw[key * KVLAB_K_STRIDE + w] = kw[g_k_off + (tile_row0 + key) * row_words + w0 + w];
    }
    barrier();
    for (uint d = d0; mine && d < d1; ++d) {  // (a hidden key's codes were not staged)
      uint code;
      KVLAB_CODE_AT(sh_kw, lid * KVLAB_K_STRIDE, d - d0, bits)
      const float cf = float(code);
      [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
        if (r < nr) part[r] += sh_q[r * dk + d] * cf;
      }
      if (++in_group == gs) {  // the end of group g: fold it as dot_qk does
        in_group = 0u;
        const float sc = ks_at(g_ks_off + meta + g), b = kb_at(g_kb_off + meta + g);
        [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
          if (r < nr) dot[r] += sc * part[r] + b * sh_qsum[r * groups + g];
          part[r] = 0.0;
        }
        ++g;
      }
    }
  }
}
#endif
#else
void dot_qk(uint key_row, uint nr, out float dot[KVLAB_MAX_R]) {
  const uint dt = g_k_dtype, dk = g_dk, base = g_k_off + key_row * dk;
  [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) dot[r] = 0.0;
  for (uint d = 0u; d < dk; ++d) {
    const float kd = dt == DT_F32 ? uintBitsToFloat(k_load32(base + d)) : load_float16(k_load16(base + d), dt);
    [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
      if (r < nr) dot[r] += sh_q[r * dk + d] * kd;
    }
  }
}
float v_at(uint key_row, uint c) {
  const uint dt = g_v_dtype, i = g_v_off + key_row * g_dv + c;
  return dt == DT_F32 ? uintBitsToFloat(v_load32(i)) : load_float16(v_load16(i), dt);
}
#endif

// reference/mask.h's visibility rule for the lower-right aligned causal mask.
bool causal_visible(uint b, uint i, uint j) {
  const int pos = int(i) + int(P[P_LK]) - int(P[P_LQ]), jj = int(j);
  if (jj > pos) return false;
  const int window = int(P[P_WINDOW]);
  if (window > 0 && !(pos < jj + window)) return false;
  const uint batch = P[P_B];
  if (P[P_HAS_LPAD] != 0u && jj < int(P[P_PADDINGS + b])) return false;
  if (P[P_HAS_RPAD] != 0u && jj >= int(P[P_LK]) - int(P[P_PADDINGS + P[P_HAS_LPAD] * batch + b])) return false;
  return true;
}

const float LOWEST = -3.4028234e38;  // below every finite score; visible scores are never −inf

void main() {
  load_hot_params();
  const uint lid = gl_LocalInvocationID.x;
  const uint hq = P[P_HQ], hkv = P[P_HKV], lq = P[P_LQ], lk = P[P_LK], dk = P[P_DK], dv = P[P_DV];
  const uint chunks = P[P_CHUNKS], chunk_len = P[P_CHUNK_LEN], kind = P[P_MASK_KIND];
  const uint group = hq / hkv, r_block = P[P_R_BLOCK], blocks = (group + r_block - 1u) / r_block;
  const uint items = P[P_B] * hkv * blocks * lq * chunks;
  const float scale = uintBitsToFloat(P[P_SCALE]), softcap = uintBitsToFloat(P[P_SOFTCAP]);
  for (uint item = gl_WorkGroupID.x; item < items; item += gl_NumWorkGroups.x) {
    const uint chunk = item % chunks, task = item / chunks;
    const uint i = task % lq, blk = (task / lq) % blocks, kvh = (task / (lq * blocks)) % hkv;
    const uint b = task / (lq * blocks * hkv);
    const uint h0 = kvh * group + blk * r_block, nr = min(r_block, group - blk * r_block);
    const uint kv_row0 = (b * hkv + kvh) * lk;  // key 0 of this kv head
    const uint all_heads = (1u << nr) - 1u;
    barrier();  // the previous item is done with the shared arrays
    for (uint x = lid; x < nr * dk; x += KVLAB_LOCAL_SIZE) {
      const uint r = x / dk, d = x % dk;
      sh_q[x] = q_at(((b * hq + h0 + r) * lq + i) * dk + d);
    }
    barrier();
#if KVLAB_QUANTIZED
    const uint gs = P[P_KGROUP], kgroups = dk / gs;
    for (uint x = lid; x < nr * kgroups; x += KVLAB_LOCAL_SIZE) {
      const uint r = x / kgroups, g = x % kgroups;
      float s = 0.0;
      for (uint d = g * gs; d < (g + 1u) * gs; ++d) s += sh_q[r * dk + d];
      sh_qsum[x] = s;
    }
    barrier();
#endif
    float acc[KVLAB_MAX_R][KVLAB_DV_PER_INVOCATION];
    float m[KVLAB_MAX_R], l[KVLAB_MAX_R];
    [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
      m[r] = 0.0;
      l[r] = 0.0;
      [[unroll]] for (uint t = 0u; t < KVLAB_DV_PER_INVOCATION; ++t) acc[r][t] = 0.0;
    }
    uint seen = 0u;  // bit r: head r has seen a visible key in this chunk
    const uint j0 = chunk * chunk_len, j1 = min(lk, j0 + chunk_len);
    for (uint t0 = j0; t0 < j1; t0 += KVLAB_LOCAL_SIZE) {
      const uint j = t0 + lid;
      uint keep = 0u;
      float add[KVLAB_MAX_R], s[KVLAB_MAX_R];
      [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
        add[r] = 0.0;
        s[r] = 0.0;
      }
      if (j < j1) {
        if (kind == MASK_NONE) {
          keep = all_heads;
        } else if (kind == MASK_CAUSAL) {
          keep = causal_visible(b, i, j) ? all_heads : 0u;
        } else {
          const uint mb = P[P_MASK_B], mh = P[P_MASK_H];
          [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
            if (r >= nr) continue;
            const uint at = P[P_MASK_OFF] + (((mb == 1u ? 0u : b) * mh + (mh == 1u ? 0u : h0 + r)) * lq + i) * lk + j;
            bool visible;
            if (kind == MASK_BOOLEAN) {
              visible = mask_byte(at) != 0u;
            } else {
              add[r] = mask_at(at);
              visible = !(isinf(add[r]) && add[r] < 0.0);
            }
            if (visible) keep |= 1u << r;
          }
        }
      }
#if KVLAB_SUBGROUP
      // The tile's flags: OR within each subgroup, then across the subgroups.
      sh_keep[lid] = keep;
      const uint sg_keep = subgroupOr(keep);
      if (subgroupElect()) sh_sg_keep[gl_SubgroupID] = sg_keep;
      barrier();
      uint tile_keep = 0u;
      for (uint g = 0u; g < gl_NumSubgroups; ++g) tile_keep |= sh_sg_keep[g];
      if (tile_keep != 0u) {  // uniform: every invocation read the same flags
        float dot[KVLAB_MAX_R];
#if KVLAB_QUANTIZED
        dot_qk_staged(kv_row0 + t0, keep != 0u, nr, dot);  // the whole workgroup: it stages the codes
#else
        if (keep != 0u) dot_qk(kv_row0 + j, nr, dot);  // only keys some head of the block may see are read
#endif
        if (keep != 0u) {
          [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
            if (((keep >> r) & 1u) == 0u) continue;
            float x = scale * dot[r];
            if (softcap > 0.0) x = softcap * kvlab_tanh(x / softcap);
            s[r] = x + add[r];
          }
        }
        [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
          if (r >= nr) continue;  // uniform
          const float sg_max = subgroupMax(((keep >> r) & 1u) != 0u ? s[r] : LOWEST);
          if (subgroupElect()) sh_sg_max[r * KVLAB_MAX_SUBGROUPS + gl_SubgroupID] = sg_max;
        }
        barrier();
        float alpha[KVLAB_MAX_R];
        [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
          alpha[r] = 1.0;
          if (((tile_keep >> r) & 1u) == 0u) continue;
          float tile_max = LOWEST;
          for (uint g = 0u; g < gl_NumSubgroups; ++g) tile_max = max(tile_max, sh_sg_max[r * KVLAB_MAX_SUBGROUPS + g]);
          const bool had = ((seen >> r) & 1u) != 0u;
          const float m_new = had ? max(m[r], tile_max) : tile_max;
          alpha[r] = had ? kvlab_exp(m[r] - m_new) : 0.0;
          m[r] = m_new;
        }
        [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
          if (r >= nr) continue;  // uniform
          const float p = ((keep >> r) & 1u) != 0u ? kvlab_exp(s[r] - m[r]) : 0.0;
          sh_p[r * KVLAB_LOCAL_SIZE + lid] = p;
          const float sg_sum = subgroupAdd(p);
          if (subgroupElect()) sh_sg_sum[r * KVLAB_MAX_SUBGROUPS + gl_SubgroupID] = sg_sum;
        }
        barrier();
        [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
          float tile_sum = 0.0;  // subgroup order: the same on every run
          if (r < nr) {
            for (uint g = 0u; g < gl_NumSubgroups; ++g) tile_sum += sh_sg_sum[r * KVLAB_MAX_SUBGROUPS + g];
          }
          l[r] = l[r] * alpha[r] + tile_sum;
          [[unroll]] for (uint t = 0u; t < KVLAB_DV_PER_INVOCATION; ++t) acc[r][t] *= alpha[r];
        }
        for (uint u = 0u; u < KVLAB_LOCAL_SIZE; ++u) {
          const uint kb = sh_keep[u];
          if (kb == 0u) continue;  // hidden from the whole block: its V is never read (it may be NaN poison)
          [[unroll]] for (uint t = 0u; t < KVLAB_DV_PER_INVOCATION; ++t) {
            const uint c = lid + t * KVLAB_LOCAL_SIZE;
            if (c >= dv) continue;
            const float vv = v_at(kv_row0 + t0 + u, c);  // loaded (decoded) once for every head
            [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
              if (((kb >> r) & 1u) != 0u) acc[r][t] += sh_p[r * KVLAB_LOCAL_SIZE + u] * vv;
            }
          }
        }
        seen |= tile_keep;
      }
      barrier();  // the next tile rewrites the shared arrays
#else
      if (keep != 0u) {  // only keys some head of the block may see are read
        float dot[KVLAB_MAX_R];
        dot_qk(kv_row0 + j, nr, dot);
        [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
          if (((keep >> r) & 1u) == 0u) continue;
          float x = scale * dot[r];
          if (softcap > 0.0) x = softcap * kvlab_tanh(x / softcap);
          s[r] = x + add[r];
        }
      }
      sh_keep[lid] = keep;
      [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
        if (r < nr) sh_p[r * KVLAB_LOCAL_SIZE + lid] = s[r];
      }
      barrier();
      uint tile_keep = 0u;
      float tile_max[KVLAB_MAX_R];
      [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) tile_max[r] = LOWEST;
      for (uint u = 0u; u < KVLAB_LOCAL_SIZE; ++u) {
        const uint kb = sh_keep[u];
        tile_keep |= kb;
        [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
          if (((kb >> r) & 1u) != 0u) tile_max[r] = max(tile_max[r], sh_p[r * KVLAB_LOCAL_SIZE + u]);
        }
      }
      barrier();
      if (tile_keep == 0u) continue;  // uniform: every invocation read the same flags
      float alpha[KVLAB_MAX_R];
      [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
        alpha[r] = 1.0;
        if (((tile_keep >> r) & 1u) == 0u) continue;
        const bool had = ((seen >> r) & 1u) != 0u;
        const float m_new = had ? max(m[r], tile_max[r]) : tile_max[r];
        alpha[r] = had ? kvlab_exp(m[r] - m_new) : 0.0;
        m[r] = m_new;
      }
      [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
        if (r < nr) sh_p[r * KVLAB_LOCAL_SIZE + lid] = ((keep >> r) & 1u) != 0u ? kvlab_exp(s[r] - m[r]) : 0.0;
      }
      barrier();
      [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
        l[r] *= alpha[r];
        [[unroll]] for (uint t = 0u; t < KVLAB_DV_PER_INVOCATION; ++t) acc[r][t] *= alpha[r];
      }
      for (uint u = 0u; u < KVLAB_LOCAL_SIZE; ++u) {
        const uint kb = sh_keep[u];
        if (kb == 0u) continue;  // hidden from the whole block: its V is never read (it may be NaN poison)
        [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
          if (((kb >> r) & 1u) != 0u) l[r] += sh_p[r * KVLAB_LOCAL_SIZE + u];
        }
        [[unroll]] for (uint t = 0u; t < KVLAB_DV_PER_INVOCATION; ++t) {
          const uint c = lid + t * KVLAB_LOCAL_SIZE;
          if (c >= dv) continue;
          const float vv = v_at(kv_row0 + t0 + u, c);  // loaded (decoded) once for every head
          [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
            if (((kb >> r) & 1u) != 0u) acc[r][t] += sh_p[r * KVLAB_LOCAL_SIZE + u] * vv;
          }
        }
      }
      seen |= tile_keep;
      barrier();
#endif
    }
    if (seen != all_heads && P[P_MEAN_POLICY] != 0u) {
      // A head with no visible key in this chunk keeps the plain sum of the chunk's
      // values, which the combine pass uses only when the whole row turns out fully
      // masked (the oracle's mean over all Lk keys, FullyMaskedRow::mean_of_values).
      float vsum[KVLAB_DV_PER_INVOCATION];
      [[unroll]] for (uint t = 0u; t < KVLAB_DV_PER_INVOCATION; ++t) vsum[t] = 0.0;
      for (uint jj = j0; jj < j1; ++jj) {
        [[unroll]] for (uint t = 0u; t < KVLAB_DV_PER_INVOCATION; ++t) {
          const uint c = lid + t * KVLAB_LOCAL_SIZE;
          if (c < dv) vsum[t] += v_at(kv_row0 + jj, c);
        }
      }
      [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
        if (((seen >> r) & 1u) != 0u) continue;
        [[unroll]] for (uint t = 0u; t < KVLAB_DV_PER_INVOCATION; ++t) acc[r][t] = vsum[t];
      }
    }
    [[unroll]] for (uint r = 0u; r < KVLAB_MAX_R; ++r) {
      if (r >= nr) continue;
      const uint row = (b * hq + h0 + r) * lq + i;
      const uint base = P[P_PARTIAL_BASE] + (row * chunks + chunk) * (dv + PARTIAL_HEADER);
      if (lid == 0u) {
        WF[base] = m[r];
        WF[base + 1u] = l[r];
        WF[base + 2u] = ((seen >> r) & 1u) != 0u ? 1.0 : 0.0;
      }
      [[unroll]] for (uint t = 0u; t < KVLAB_DV_PER_INVOCATION; ++t) {
        const uint c = lid + t * KVLAB_LOCAL_SIZE;
        if (c < dv) WF[base + PARTIAL_HEADER + c] = acc[r][t];
      }
    }
  }
}
