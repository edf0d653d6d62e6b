// SIMD scaled dot-product attention (contract: reference/sdpa.h), within the harness's
// attention_budget (harness/ops/sdpa_info.cc, f32 accumulation) of the oracle.
//
// Decode (every query row of a kv head sees the same keys, R·Lq <= 32 rows) takes the
// fused flash-decoding kernel of quantized_sdpa over plain f16/bf16/f32 rows
// (quantized_decode.h, decode_path_takes below): each K/V element is loaded once for all
// the rows of its GQA group, scores are reduced N keys at a time by a transposing tree,
// and nothing is converted into scratch rows. Everything else takes the kernel below.
//
// Algorithm: flash-attention style online softmax over blocks of keys, in f32. A task
// owns one (batch row, kv head, block of query positions, range of keys) and all R query
// heads of that kv head's group, so each key block is loaded (and converted from f16/bf16
// to f32) once for R·positions query rows. Per block and query row:
//   list the visible keys (mask); s = scale·<q, k> (vector dot products, MulAdd);
//   softcap; + additive mask; m' = max(m, max s); l = l·e^{m−m'} + Σ e^{s−m'};
//   acc = acc·e^{m−m'} + Σ e^{s−m'}·v.
// A hidden key is never read: only keys some row of the task sees are loaded, and a row
// only touches the keys on its own list (NaN poison in hidden slots cannot leak, and no
// 0·NaN). Every buffer row is padded with zeros to whole vectors, so no tail loops.
//
// Work split (kernels/simd/parallel.h): tasks are (b, kv head, query block, key split),
// and every size in the split is a function of the problem only, never of the thread
// count; a task's partial (m, l, acc) per row is combined with the other key splits in
// split order. So the output bits are the same for any KVLAB_THREADS. Key splits
// (flash-decoding) only happen when there are too few other tasks (decode).
//
// Special values, as the oracle (double) gives them: a visible score that is NaN or +inf
// makes the whole row NaN (its max or its exponentials are NaN there); a row whose visible
// scores are all −inf, without a sink, is NaN (e^{−inf − (−inf)}); f16/bf16 inf/NaN
// inputs stay inf/NaN through the exact conversion below. Fully masked rows follow
// params.fully_masked (0, or the mean of v over all keys, in double).
#ifndef KVLAB_SIMD_SDPA_COMMON
#define KVLAB_SIMD_SDPA_COMMON
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/simd/parallel.h"
#include "kernels/simd/quantized_decode.h"
#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"
#include "reference/sdpa.h"

namespace kvlab::simd::sdpa_detail {

// Everything a task needs, fixed before the tasks start.
struct Geometry {
  std::int64_t batch = 0, hq = 0, hkv = 0, group = 0, lq = 0, lk = 0, dk = 0, dv = 0;
  DType dtype = DType::f32;
  const std::byte *q = nullptr, *k = nullptr, *v = nullptr;
  const ConstTensorView* mask = nullptr;  // boolean / additive array, or null
  std::int64_t mask_b = 1, mask_h = 1;
  const ConstTensorView* sinks = nullptr;
  const AttentionParams* params = nullptr;
  // The split: query positions per task, key splits and keys per split.
  std::int64_t q_per_task = 1, q_blocks = 1, key_splits = 1, keys_per_split = 0;
  std::int64_t keys_per_block = 64;
};

// The partial result of one query row over one key range: unnormalized, relative to m.
struct RowState {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0;
  bool any_visible = false;
  bool nan = false;  // a visible score was NaN or +inf
};

}  // namespace kvlab::simd::sdpa_detail
#endif  // KVLAB_SIMD_SDPA_COMMON

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/sdpa.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "kernels/simd/half_convert-inl.h"
#include "kernels/simd/softcap-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvlab::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace sd = kvlab::simd::sdpa_detail;

namespace sdpa_impl {

using DF = hn::ScalableTag<float>;

std::size_t padded(std::int64_t n) {
  const std::size_t lanes = hn::Lanes(DF());
  return (static_cast<std::size_t>(n) + lanes - 1) / lanes * lanes;
}

// n stored elements of `dtype` → f32, exactly (the zero padding after them is untouched;
// f16/bf16 by the shared conversions of half_convert-inl.h).
void RowToF32(const std::byte* src, DType dtype, std::size_t n, float* HWY_RESTRICT dst) {
  if (dtype == DType::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  HalfRowToF32(reinterpret_cast<const std::uint16_t*>(src), dtype == DType::bf16, n, dst);
}

// s[t] = <q, keys row idx[t]> over `width` (padded) floats; four keys per pass share the
// q loads.
void Dots(const float* HWY_RESTRICT q, const float* HWY_RESTRICT keys, std::size_t width,
          const std::int32_t* HWY_RESTRICT idx, std::size_t count, float* HWY_RESTRICT s) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  std::size_t t = 0;
  for (; t + 4 <= count; t += 4) {
    const float* k0 = keys + static_cast<std::size_t>(idx[t]) * width;
    const float* k1 = keys + static_cast<std::size_t>(idx[t + 1]) * width;
    const float* k2 = keys + static_cast<std::size_t>(idx[t + 2]) * width;
    const float* k3 = keys + static_cast<std::size_t>(idx[t + 3]) * width;
    auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    for (std::size_t c = 0; c < width; c += N) {
      const auto vq = hn::LoadU(df, q + c);
      a0 = hn::MulAdd(vq, hn::LoadU(df, k0 + c), a0);
      a1 = hn::MulAdd(vq, hn::LoadU(df, k1 + c), a1);
      a2 = hn::MulAdd(vq, hn::LoadU(df, k2 + c), a2);
      a3 = hn::MulAdd(vq, hn::LoadU(df, k3 + c), a3);
    }
    s[t] = hn::GetLane(hn::SumOfLanes(df, a0));
    s[t + 1] = hn::GetLane(hn::SumOfLanes(df, a1));
    s[t + 2] = hn::GetLane(hn::SumOfLanes(df, a2));
    s[t + 3] = hn::GetLane(hn::SumOfLanes(df, a3));
  }
  for (; t < count; ++t) {
    const float* k0 = keys + static_cast<std::size_t>(idx[t]) * width;
    auto a0 = hn::Zero(df);
    for (std::size_t c = 0; c < width; c += N) a0 = hn::MulAdd(hn::LoadU(df, q + c), hn::LoadU(df, k0 + c), a0);
    s[t] = hn::GetLane(hn::SumOfLanes(df, a0));
  }
}

// acc = acc·corr + Σ_t p[t]·values row idx[t], four vectors of acc held in registers.
void AccumulateValues(const float* HWY_RESTRICT p, const std::int32_t* HWY_RESTRICT idx, std::size_t count,
                      const float* HWY_RESTRICT values, std::size_t width, float corr, float* HWY_RESTRICT acc) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const auto vcorr = hn::Set(df, corr);
  std::size_t c = 0;
  for (; c + 4 * N <= width; c += 4 * N) {
    auto a0 = hn::Mul(hn::LoadU(df, acc + c), vcorr), a1 = hn::Mul(hn::LoadU(df, acc + c + N), vcorr);
    auto a2 = hn::Mul(hn::LoadU(df, acc + c + 2 * N), vcorr), a3 = hn::Mul(hn::LoadU(df, acc + c + 3 * N), vcorr);
    for (std::size_t t = 0; t < count; ++t) {
      const float* row = values + static_cast<std::size_t>(idx[t]) * width + c;
      const auto vp = hn::Set(df, p[t]);
      a0 = hn::MulAdd(vp, hn::LoadU(df, row), a0);
      a1 = hn::MulAdd(vp, hn::LoadU(df, row + N), a1);
      a2 = hn::MulAdd(vp, hn::LoadU(df, row + 2 * N), a2);
      a3 = hn::MulAdd(vp, hn::LoadU(df, row + 3 * N), a3);
    }
    hn::StoreU(a0, df, acc + c);
    hn::StoreU(a1, df, acc + c + N);
    hn::StoreU(a2, df, acc + c + 2 * N);
    hn::StoreU(a3, df, acc + c + 3 * N);
  }
  for (; c < width; c += N) {
    auto a0 = hn::Mul(hn::LoadU(df, acc + c), vcorr);
    for (std::size_t t = 0; t < count; ++t) {
      a0 = hn::MulAdd(hn::Set(df, p[t]), hn::LoadU(df, values + static_cast<std::size_t>(idx[t]) * width + c), a0);
    }
    hn::StoreU(a0, df, acc + c);
  }
}

// One query row's scores of a block (s has `count` entries, padded with −inf to whole
// vectors): scale, softcap, additive mask; then the online-softmax update of st/acc.
void UpdateRow(const sd::Geometry& g, float* HWY_RESTRICT s, const float* HWY_RESTRICT add, std::size_t count,
               const std::int32_t* HWY_RESTRICT idx, const float* HWY_RESTRICT values, std::size_t dv_width,
               sd::RowState& st, float* HWY_RESTRICT acc) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const float softcap = g.params->softcap;
  const auto vscale = hn::Set(df, g.params->scale), vcap = hn::Set(df, softcap);
  const auto vinf = hn::Set(df, std::numeric_limits<float>::infinity());
  auto vmax = hn::Set(df, -std::numeric_limits<float>::infinity());
  auto bad = hn::Zero(df);  // lanes that saw NaN or +inf become nonzero
  for (std::size_t t = 0; t < count; t += N) {
    auto x = hn::Mul(hn::LoadU(df, s + t), vscale);
    if (softcap > 0) x = Softcap(df, x, vcap);  // capped before the mask is added
    if (add != nullptr) x = hn::Add(x, hn::LoadU(df, add + t));
    // Lanes past `count` hold −inf: restore it (scale·(−inf) is ±inf or NaN).
    if (t + N > count) x = hn::IfThenElse(hn::FirstN(df, count - t), x, hn::Neg(vinf));
    bad = hn::Or(bad, hn::VecFromMask(df, hn::Or(hn::IsNaN(x), hn::Eq(x, vinf))));
    vmax = hn::Max(vmax, x);
    hn::StoreU(x, df, s + t);
  }
  if (!hn::AllTrue(df, hn::Eq(bad, hn::Zero(df)))) {
    st.nan = true;
    return;
  }
  const float block_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  const float m_new = std::max(st.m, block_max);
  if (m_new == -std::numeric_limits<float>::infinity()) return;  // every score −inf: weight 0
  const float corr = std::exp(st.m - m_new);                      // 0 when st.m is −inf
  const auto vm = hn::Set(df, m_new);
  auto sum = hn::Zero(df);
  for (std::size_t t = 0; t < count; t += N) {
    const auto p = hn::Exp(df, hn::Sub(hn::LoadU(df, s + t), vm));  // e^{−inf} = 0 for the padding
    sum = hn::Add(sum, p);
    hn::StoreU(p, df, s + t);
  }
  st.l = st.l * corr + hn::GetLane(hn::SumOfLanes(df, sum));
  st.m = m_new;
  AccumulateValues(s, idx, count, values, dv_width, corr, acc);
}

// Scratch of one task, sized for its rows and one key block.
struct Scratch {
  std::size_t dk_w = 0, dv_w = 0, block_w = 0;
  std::vector<float> q, keys, values, scores, adds, acc;
  std::vector<std::int32_t> idx, counts;
  std::vector<unsigned char> needed;
  std::vector<sd::RowState> state;
};

// Task `task` of the split in g: writes, for each of its rows, the RowState and the
// unnormalized accumulator (padded(Dv) floats) at the row's slot of the partial buffers.
void RunTask(const sd::Geometry& g, std::int64_t task, float* HWY_RESTRICT partial_acc,
             sd::RowState* HWY_RESTRICT partial_state) {
  // Task index = ((b·Hkv + kv head)·q_blocks + query block)·key_splits + key split.
  const std::int64_t split = task % g.key_splits;
  const std::int64_t qblock = (task / g.key_splits) % g.q_blocks;
  const std::int64_t kvh = (task / (g.key_splits * g.q_blocks)) % g.hkv;
  const std::int64_t b = task / (g.key_splits * g.q_blocks * g.hkv);
  const std::int64_t i0 = qblock * g.q_per_task, i1 = std::min(g.lq, i0 + g.q_per_task);
  const std::int64_t k0 = split * g.keys_per_split, k1 = std::min(g.lk, k0 + g.keys_per_split);
  const std::int64_t npos = i1 - i0, rows = g.group * npos;  // row r = (head in group)·npos + position
  const MaskSpec& mspec = g.params->mask;
  const MaskKind kind = mspec.kind;

  Scratch sc;
  sc.dk_w = padded(g.dk);
  sc.dv_w = padded(g.dv);
  const auto kb = static_cast<std::size_t>(g.keys_per_block);
  sc.block_w = padded(g.keys_per_block);
  const auto urows = static_cast<std::size_t>(rows);
  sc.q.assign(urows * sc.dk_w, 0.0f);
  sc.keys.assign(kb * sc.dk_w, 0.0f);
  sc.values.assign(kb * sc.dv_w, 0.0f);
  sc.scores.assign(sc.block_w, 0.0f);
  sc.adds.assign(kind == MaskKind::additive ? urows * sc.block_w : 0, 0.0f);
  sc.idx.assign(urows * kb, 0);
  sc.counts.assign(urows, 0);
  sc.needed.assign(kb, 0);
  sc.state.assign(urows, sd::RowState{});
  sc.acc.assign(urows * sc.dv_w, 0.0f);

  const std::size_t elem = dtype_size(g.dtype);
  std::vector<std::int64_t> lo(urows, k0), hi(urows, k1), head(urows), pos(urows), mask_row(urows, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const std::int64_t h = kvh * g.group + r / npos, i = i0 + r % npos;
    head[ur] = h;
    pos[ur] = i;
    RowToF32(g.q + static_cast<std::size_t>(((b * g.hq + h) * g.lq + i) * g.dk) * elem, g.dtype,
             static_cast<std::size_t>(g.dk), sc.q.data() + ur * sc.dk_w);
    if (kind == MaskKind::causal) {
      // Keys visible to query i form one range (reference/mask.h, lower-right aligned).
      const std::int64_t p = i + g.lk - g.lq;
      const auto ub = static_cast<std::size_t>(b);
      const std::int64_t left = mspec.left_padding.empty() ? 0 : mspec.left_padding[ub];
      const std::int64_t right = mspec.right_padding.empty() ? 0 : mspec.right_padding[ub];
      std::int64_t first = std::max<std::int64_t>(0, left);
      if (mspec.window > 0) first = std::max(first, p - mspec.window + 1);
      lo[ur] = std::max(k0, first);
      hi[ur] = std::min({k1, p + 1, g.lk - right});
    } else if (g.mask != nullptr) {
      mask_row[ur] = (((g.mask_b == 1 ? 0 : b) * g.mask_h + (g.mask_h == 1 ? 0 : h)) * g.lq + i) * g.lk;
    }
  }
  const std::int64_t task_lo = *std::min_element(lo.begin(), lo.end());
  const std::int64_t task_hi = *std::max_element(hi.begin(), hi.end());
  const std::size_t kv_row0 = static_cast<std::size_t>((b * g.hkv + kvh) * g.lk);

  for (std::int64_t j0 = task_lo; j0 < task_hi; j0 += g.keys_per_block) {
    const std::int64_t j1 = std::min(task_hi, j0 + g.keys_per_block);
    std::fill(sc.needed.begin(), sc.needed.end(), 0);
    // 1. Each row's visible keys of the block (indices relative to j0).
    for (std::size_t ur = 0; ur < urows; ++ur) {
      std::int32_t* list = sc.idx.data() + ur * kb;
      std::int32_t n = 0;
      if (kind == MaskKind::causal || kind == MaskKind::none) {
        const std::int64_t first = std::max(j0, lo[ur]), last = std::min(j1, hi[ur]);
        for (std::int64_t j = first; j < last; ++j) list[n++] = static_cast<std::int32_t>(j - j0);
      } else if (kind == MaskKind::boolean) {
        const auto* m = reinterpret_cast<const unsigned char*>(g.mask->data) + mask_row[ur];
        for (std::int64_t j = j0; j < j1; ++j)
          if (m[j] != 0) list[n++] = static_cast<std::int32_t>(j - j0);
      } else {
        float* add = sc.adds.data() + ur * sc.block_w;
        for (std::int64_t j = j0; j < j1; ++j) {
          const float a = g.mask->load(mask_row[ur] + j);
          if (a == -std::numeric_limits<float>::infinity()) continue;  // −inf hides the key
          add[n] = a;
          list[n++] = static_cast<std::int32_t>(j - j0);
        }
      }
      sc.counts[ur] = n;
      for (std::int32_t t = 0; t < n; ++t) sc.needed[static_cast<std::size_t>(list[t])] = 1;
    }
    // 2. Load (and convert) only the keys some row sees.
    for (std::int64_t j = j0; j < j1; ++j) {
      const auto jj = static_cast<std::size_t>(j - j0);
      if (sc.needed[jj] == 0) continue;
      const std::size_t row = kv_row0 + static_cast<std::size_t>(j);
      RowToF32(g.k + row * static_cast<std::size_t>(g.dk) * elem, g.dtype, static_cast<std::size_t>(g.dk),
               sc.keys.data() + jj * sc.dk_w);
      RowToF32(g.v + row * static_cast<std::size_t>(g.dv) * elem, g.dtype, static_cast<std::size_t>(g.dv),
               sc.values.data() + jj * sc.dv_w);
    }
    // 3. Scores and the online-softmax update, row by row.
    for (std::size_t ur = 0; ur < urows; ++ur) {
      const auto count = static_cast<std::size_t>(sc.counts[ur]);
      sd::RowState& st = sc.state[ur];
      if (count == 0 || st.nan) {
        st.any_visible = st.any_visible || count > 0;
        continue;
      }
      st.any_visible = true;
      const std::int32_t* list = sc.idx.data() + ur * kb;
      Dots(sc.q.data() + ur * sc.dk_w, sc.keys.data(), sc.dk_w, list, count, sc.scores.data());
      std::fill(sc.scores.begin() + static_cast<std::ptrdiff_t>(count), sc.scores.end(),
                -std::numeric_limits<float>::infinity());
      const float* add = nullptr;
      if (kind == MaskKind::additive) {
        float* a = sc.adds.data() + ur * sc.block_w;
        std::fill(a + count, a + sc.block_w, 0.0f);
        add = a;
      }
      UpdateRow(g, sc.scores.data(), add, count, list, sc.values.data(), sc.dv_w, st, sc.acc.data() + ur * sc.dv_w);
    }
  }

  // Partial buffers are indexed by (global row, key split).
  for (std::size_t ur = 0; ur < urows; ++ur) {
    const std::int64_t grow = (b * g.hq + head[ur]) * g.lq + pos[ur];
    const auto slot = static_cast<std::size_t>(grow * g.key_splits + split);
    partial_state[slot] = sc.state[ur];
    std::memcpy(partial_acc + slot * sc.dv_w, sc.acc.data() + ur * sc.dv_w, sc.dv_w * sizeof(float));
  }
}

}  // namespace sdpa_impl

void SdpaTask(const sd::Geometry& g, std::int64_t task, float* partial_acc, sd::RowState* partial_state) {
  sdpa_impl::RunTask(g, task, partial_acc, partial_state);
}

// The padded accumulator width (Dv rounded up to whole vectors) of this target.
std::size_t SdpaAccWidth(std::int64_t dv) { return sdpa_impl::padded(dv); }

}  // namespace kvlab::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvlab::simd {

HWY_EXPORT(SdpaTask);
HWY_EXPORT(SdpaAccWidth);

namespace sdpa_detail {
namespace {

// Rows per task: the R heads of a group times enough query positions for ~32 rows.
constexpr std::int64_t kRowsPerTask = 32;
// Below this many (b, kv head, query block) tasks the keys are split as well...
constexpr std::int64_t kWantTasks = 256;
// ...into ranges of at least this many keys.
constexpr std::int64_t kMinKeysPerSplit = 1024;

// The split, from the problem's sizes alone (never from the thread count).
void choose_split(Geometry& g) {
  g.q_per_task = std::max<std::int64_t>(1, std::min(g.lq, kRowsPerTask / g.group));
  g.q_blocks = (g.lq + g.q_per_task - 1) / g.q_per_task;
  const std::int64_t tasks = g.batch * g.hkv * g.q_blocks;
  const std::int64_t by_length = std::max<std::int64_t>(1, g.lk / kMinKeysPerSplit);
  g.key_splits = tasks >= kWantTasks ? 1 : std::min(by_length, (kWantTasks + tasks - 1) / tasks);
  g.keys_per_split = (g.lk + g.key_splits - 1) / g.key_splits;
  // Key blocks of ~64 KiB of f32 K and V rows (>= 8 keys), so they stay in L2.
  g.keys_per_block = std::clamp<std::int64_t>(16384 / (g.dk + g.dv), 8, 128);
}

// Mean of v over all Lk keys of (b, kv head), in double (the mean_of_values policy).
std::vector<double> mean_of_values(const ConstTensorView& v, std::int64_t b, std::int64_t kvh) {
  const std::int64_t hkv = v.dim(1), lk = v.dim(2), dv = v.dim(3);
  std::vector<double> mean(static_cast<std::size_t>(dv), 0.0);
  const std::int64_t base = (b * hkv + kvh) * lk * dv;
  for (std::int64_t j = 0; j < lk; ++j)
    for (std::int64_t c = 0; c < dv; ++c) mean[static_cast<std::size_t>(c)] += v.load(base + j * dv + c);
  for (double& m : mean) m /= static_cast<double>(lk);
  return mean;
}

// Combines the key splits of one output row in split order (with the sink) and stores it.
void finish_row(const Geometry& g, const ConstTensorView& v, std::int64_t b, std::int64_t h, std::int64_t i,
                const float* acc, const RowState* state, std::size_t acc_w, std::vector<double>& mean,
                const TensorView& out) {
  const std::int64_t out_row = ((b * g.hq + h) * g.lq + i) * g.dv;
  bool any = false, nan = false;
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t s = 0; s < g.key_splits; ++s) {
    any = any || state[s].any_visible;
    nan = nan || state[s].nan;
    m = std::max(m, state[s].m);
  }
  if (!any) {
    if (g.params->fully_masked == FullyMaskedRow::mean_of_values) {
      if (mean.empty()) mean = mean_of_values(v, b, h / g.group);  // once per (b, head)
      for (std::int64_t c = 0; c < g.dv; ++c) {
        out.store(out_row + c, static_cast<float>(mean[static_cast<std::size_t>(c)]));
      }
    } else {
      for (std::int64_t c = 0; c < g.dv; ++c) out.store(out_row + c, 0.0f);
    }
    return;
  }
  float sink = 0;
  if (g.sinks != nullptr) {
    sink = g.sinks->load(h);
    m = std::max(m, sink);
  }
  if (nan || m == -std::numeric_limits<float>::infinity()) {
    for (std::int64_t c = 0; c < g.dv; ++c) out.store(out_row + c, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  float l = g.sinks != nullptr ? std::exp(sink - m) : 0.0f;
  std::vector<float> o(acc_w, 0.0f);
  for (std::int64_t s = 0; s < g.key_splits; ++s) {
    if (state[s].m == -std::numeric_limits<float>::infinity()) continue;  // no weight in this split
    const float w = std::exp(state[s].m - m);
    l += state[s].l * w;
    const float* a = acc + static_cast<std::size_t>(s) * acc_w;
    for (std::size_t c = 0; c < acc_w; ++c) o[c] += a[c] * w;
  }
  for (std::int64_t c = 0; c < g.dv; ++c) out.store(out_row + c, o[static_cast<std::size_t>(c)] / l);
}

}  // namespace
}  // namespace sdpa_detail

namespace {

// Decode: the fused flash-decoding kernel of quantized_sdpa over plain rows
// (quantized_decode.h), which loads each K/V element once for all of a kv head's query
// rows and reduces scores N keys at a time. It runs every key of a chunk's span for every
// row, so it takes only problems where all rows see the same keys (no mask, or causal
// with one query position: no hidden key inside the span, whose poison a zero weight
// would turn into 0·NaN), head dims of whole vectors (Dv of whole pairs of them: the V
// side takes two or four vectors at a time), and at most kMaxFusedRows rows.
bool decode_path_takes(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                       const AttentionParams& params) {
  const std::int64_t rows = q.dim(1) / k.dim(1) * q.dim(2);
  const bool same_keys = params.mask.kind == MaskKind::none || (params.mask.kind == MaskKind::causal && q.dim(2) == 1);
  return same_keys && rows <= qdecode::kMaxFusedRows && q.dim(3) % 16 == 0 && v.dim(3) % 32 == 0;
}

void decode(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
            const AttentionParams& params, const ConstTensorView* sinks, const TensorView& out) {
  qdecode::DecodePlan plan;
  plan.k = qdecode::plain_side(k.data, k.dtype, k.dim(3));
  plan.v = qdecode::plain_side(v.data, v.dtype, v.dim(3));
  plan.hkv = k.dim(1);
  plan.lk = k.dim(2);
  qdecode::run(plan, q, params, nullptr, sinks, out);
}

}  // namespace

void sdpa(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
          const AttentionParams& params, const ConstTensorView* mask_array, const ConstTensorView* sinks,
          const TensorView& out) {
  namespace sd = sdpa_detail;
  qdecode::note_call_start();
  ref::validate_sdpa(q, k, v, params, mask_array, sinks, out);  // the oracle's checks and messages
  if (decode_path_takes(q, k, v, params)) return decode(q, k, v, params, sinks, out);

  sd::Geometry g;
  g.batch = q.dim(0);
  g.hq = q.dim(1);
  g.lq = q.dim(2);
  g.dk = q.dim(3);
  g.hkv = k.dim(1);
  g.lk = k.dim(2);
  g.dv = v.dim(3);
  g.group = g.hq / g.hkv;
  g.dtype = q.dtype;
  g.q = q.data;
  g.k = k.data;
  g.v = v.data;
  g.params = &params;
  g.sinks = sinks;
  if (params.mask.kind == MaskKind::boolean || params.mask.kind == MaskKind::additive) {
    g.mask = mask_array;
    g.mask_b = mask_array->dim(0);
    g.mask_h = mask_array->dim(1);
  }
  sd::choose_split(g);

  // Resolved once here: every task then runs the same target's code.
  const auto acc_w = HWY_DYNAMIC_DISPATCH(SdpaAccWidth)(g.dv);
  auto* const task_fn = &HWY_DYNAMIC_DISPATCH(SdpaTask);
  const auto slots = static_cast<std::size_t>(g.batch * g.hq * g.lq * g.key_splits);
  std::vector<float> partial_acc(slots * acc_w);
  std::vector<sd::RowState> partial_state(slots);
  const std::int64_t tasks = g.batch * g.hkv * g.q_blocks * g.key_splits;
  parallel_for(tasks, [&](std::int64_t t) { task_fn(g, t, partial_acc.data(), partial_state.data()); });

  // Combine and store, one (b, head) per task.
  parallel_for(g.batch * g.hq, [&](std::int64_t bh) {
    const std::int64_t b = bh / g.hq, h = bh % g.hq;
    std::vector<double> mean;
    for (std::int64_t i = 0; i < g.lq; ++i) {
      const auto slot = static_cast<std::size_t>(((b * g.hq + h) * g.lq + i) * g.key_splits);
      sd::finish_row(g, v, b, h, i, partial_acc.data() + slot * acc_w, partial_state.data() + slot, acc_w, mean,
                     out);
    }
  });
}

}  // namespace kvlab::simd
#endif  // HWY_ONCE
