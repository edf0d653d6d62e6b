// Reference TurboQuant MSE codec. Plain loops, all arithmetic in double (the oracle is
// the exact math; only the stored norm (f16) and the output dtype round), single thread,
// no intrinsics, so the result is a function of the inputs alone (vlm#967: the fused
// Metal quantize was nondeterministic).
#include "reference/turboquant.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>

#include "kvlab/error.h"
#include "reference/bitpack.h"

namespace kvlab::ref {

namespace {

// Lloyd–Max schedule. mlx-vlm's (docs/turboquant.md §MSE codec): 32 768 grid points, at most 100
// iterations, stop below 1e-6. That leaves b = 4 short of the fixed point (Lloyd moves
// the outer levels by ~1e-4/iteration after 100 steps), so the oracle iterates to
// convergence instead: the levels are the Lloyd–Max optimum to ~1e-9·√d.
constexpr int kGridPoints = 32768;
constexpr int kMaxLloydIterations = 20000;
constexpr double kLloydTolerance = 1e-12;
constexpr double kNormFloor = 1e-6;    // u = x / max(norm, 1e-6), mlx-vlm _EPS
constexpr std::uint64_t kDimSeedStride = 7919;  // mlx-vlm: default_rng(seed + dim·7919)

// splitmix64: a tiny, fully specified generator, so the rotation is reproducible on any
// platform and standard library (std::normal_distribution is implementation-defined).
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform on (0, 1]: never 0, so log() below is finite.
  double uniform() { return static_cast<double>((next() >> 11) + 1) * 0x1p-53; }

 private:
  std::uint64_t state_;
};

void require_bits(int bits) {
  KVLAB_REQUIRE(bits >= 1 && bits <= 8, invalid_argument, "TurboQuant bits ", bits, " is outside 1..8");
}
void require_dim(int dim) {
  KVLAB_REQUIRE(dim >= 1, invalid_argument, "TurboQuant dim ", dim, " is not positive");
}
bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

std::uint64_t stream_seed(int dim, std::uint64_t seed) {
  return seed + static_cast<std::uint64_t>(dim) * kDimSeedStride;  // wraps mod 2^64 by design
}

// Unnormalised in-place Walsh–Hadamard transform (mx.hadamard_transform without its
// scale); v.size() is a power of two.
void fwht(std::span<double> v) {
  for (std::size_t h = 1; h < v.size(); h *= 2) {
    for (std::size_t i = 0; i < v.size(); i += 2 * h) {
      for (std::size_t j = i; j < i + h; ++j) {
        const double a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
}

// norms may be (...) or (..., 1): the former is mlx-vlm's state layout, the latter the
// row-aligned block the cache moves with the seq:: helpers.
void require_norms(const ConstTensorView& norms, const Shape& lead, const char* who) {
  require_dtype(norms, DType::f16, "TurboQuant norms");
  KVLAB_REQUIRE(norms.shape == lead || norms.shape == shape_appended(lead, 1), shape_mismatch, who, ": norms have shape ",
                shape_str(norms.shape), ", expected ", shape_str(lead), " or ", shape_str(shape_appended(lead, 1)));
}

// The vector width W a codec reads from / writes to, and its checks.
void require_vectors(const ConstTensorView& t, const TurboQuantCodec& codec, const char* what) {
  require_float(t, what);
  KVLAB_REQUIRE(t.rank() >= 1, shape_mismatch, what, " has rank 0 (shape ", shape_str(t.shape),
                "), expected (..., D)");
  const std::int64_t width = t.shape.back();
  if (codec.channels.empty()) {
    KVLAB_REQUIRE(width == codec.dim, shape_mismatch, what, " has last axis ", width, " but the codec dim is ",
                  codec.dim);
  }
  validate_turboquant_codec(codec, width);
}

std::vector<double> midpoints(const TurboQuantCodec& codec) {
  std::vector<double> mids(codec.codebook.size() - 1);
  // Sum of two floats halved: exact in double, so a coordinate goes to its nearest level.
  // Not mlx-vlm's thresholds bit for bit: it rounds the sum to f32, up to half an ulp off
  // where the two levels differ in exponent (docs/turboquant.md §Against mlx-vlm, V13).
  for (std::size_t m = 0; m + 1 < codec.codebook.size(); ++m) {
    mids[m] = (static_cast<double>(codec.codebook[m]) + static_cast<double>(codec.codebook[m + 1])) / 2.0;
  }
  return mids;
}

// channel j of the codec -> channel of the full vector
std::int64_t channel(const TurboQuantCodec& codec, int j) {
  return codec.channels.empty() ? j : codec.channels[static_cast<std::size_t>(j)];
}

}  // namespace

// ---- construction -------------------------------------------------------------------

// Lloyd–Max for one coordinate of a uniform unit vector in R^dim. Substituting x = sin θ
// turns the density (1 − x²)^((D−3)/2) dx into cos^(D−2)θ dθ on [−π/2, π/2], which is
// bounded for every D >= 2 (the x form is infinite at ±1 for D = 2). The cell mass F is
// the trapezoid integral over 32 768 equal θ intervals, interpolated exactly (quadratic)
// inside an interval, and the first moment ∫ x f = −cos^(D−1)θ/(D−1) is exact. Both are
// continuous in the cell boundaries: a Lloyd iteration over a sampled grid (mlx-vlm's,
// docs/turboquant.md §MSE codec) stalls once the boundaries move less than one grid step, which at
// b = 4 freezes the outer levels up to 1.5e-2·/√d short of the optimum.
std::vector<double> turboquant_codebook(int dim, int bits) {
  require_dim(dim);
  require_bits(bits);
  const auto levels = std::size_t{1} << bits;
  std::vector<double> c(levels);
  if (dim == 1) {
    // A unit vector in R^1 is ±1: any codebook holding ±1 is exact; spread the rest evenly.
    for (std::size_t k = 0; k < levels; ++k)
      c[k] = -1.0 + 2.0 * static_cast<double>(k) / static_cast<double>(levels - 1);
    return c;
  }
  const double pi = std::numbers::pi, h = pi / kGridPoints;
  const auto n = static_cast<std::size_t>(kGridPoints);
  std::vector<double> theta(n + 1), w(n + 1), mass(n + 1, 0.0);
  for (std::size_t i = 0; i <= n; ++i) {
    theta[i] = -pi / 2 + static_cast<double>(i) * h;
    w[i] = std::pow(std::cos(theta[i]), dim - 2);
  }
  w[0] = w[n] = dim == 2 ? 1.0 : 0.0;  // cos(±π/2) is not exactly 0 in double
  for (std::size_t i = 0; i < n; ++i) mass[i + 1] = mass[i] + h * (w[i] + w[i + 1]) / 2;
  const auto mass_below = [&](double t) {  // F(t), continuous and increasing in t
    if (t <= theta[0]) return 0.0;
    if (t >= theta[n]) return mass[n];
    const std::size_t i = std::min(n - 1, static_cast<std::size_t>((t - theta[0]) / h));
    const double dt = t - theta[i];
    return mass[i] + dt * w[i] + dt * dt * (w[i + 1] - w[i]) / (2 * h);
  };
  const auto moment_below = [&](double t) { return -std::pow(std::cos(t), dim - 1) / (dim - 1); };
  // Quantile initialisation: the first node whose CDF reaches (k + 0.5)/L.
  for (std::size_t i = 0, k = 0; i <= n && k < levels; ++i)
    while (k < levels && mass[i] >= (static_cast<double>(k) + 0.5) / static_cast<double>(levels) * mass[n])
      c[k++] = std::sin(theta[i]);
  std::vector<double> edge(levels + 1);
  edge.front() = theta.front();
  edge.back() = theta.back();
  for (int it = 0; it < kMaxLloydIterations; ++it) {
    for (std::size_t k = 1; k < levels; ++k) edge[k] = std::asin((c[k - 1] + c[k]) / 2);
    double moved = 0;
    std::vector<double> next = c;
    for (std::size_t k = 0; k < levels; ++k) {
      const double m = mass_below(edge[k + 1]) - mass_below(edge[k]);
      if (m > 0) next[k] = (moment_below(edge[k + 1]) - moment_below(edge[k])) / m;  // empty cell: keep
    }
    // The density is even; exact antisymmetry removes rounding noise and puts the
    // middle threshold of the (even-sized) codebook exactly at 0.
    for (std::size_t k = 0; k < levels / 2; ++k) {
      const double a = (next[k] - next[levels - 1 - k]) / 2.0;
      next[k] = a;
      next[levels - 1 - k] = -a;
    }
    for (std::size_t k = 0; k < levels; ++k) moved = std::max(moved, std::abs(next[k] - c[k]));
    c = std::move(next);
    if (moved < kLloydTolerance) break;
  }
  return c;
}

std::vector<float> turboquant_rht_signs(int dim, std::uint64_t seed) {
  require_dim(dim);
  KVLAB_REQUIRE(is_power_of_two(dim), invalid_argument, "RHT needs a power-of-two dim, got ", dim);
  SplitMix64 rng(stream_seed(dim, seed));
  std::vector<float> signs(static_cast<std::size_t>(dim));
  for (auto& s : signs) s = (rng.next() >> 63) != 0 ? 1.0f : -1.0f;
  return signs;
}

std::vector<double> turboquant_haar_rotation(int dim, std::uint64_t seed) {
  require_dim(dim);
  const auto n = static_cast<std::size_t>(dim);
  SplitMix64 rng(stream_seed(dim, seed));
  std::vector<double> a(n * n);
  for (std::size_t i = 0; i < a.size(); i += 2) {  // Box–Muller, both outputs
    const double r = std::sqrt(-2.0 * std::log(rng.uniform())), t = 2.0 * std::numbers::pi * rng.uniform();
    a[i] = r * std::cos(t);
    if (i + 1 < a.size()) a[i + 1] = r * std::sin(t);
  }
  // Householder QR: A = H_0 … H_{n−1} R. R_kk = alpha_k.
  std::vector<std::vector<double>> reflectors(n);
  std::vector<double> r_diag(n, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    double norm2 = 0;
    for (std::size_t i = k; i < n; ++i) norm2 += a[i * n + k] * a[i * n + k];
    const double norm = std::sqrt(norm2);
    if (norm == 0) continue;  // measure zero; H_k = I and R_kk = 0
    const double alpha = a[k * n + k] > 0 ? -norm : norm;
    std::vector<double> v(n - k);
    for (std::size_t i = k; i < n; ++i) v[i - k] = a[i * n + k];
    v[0] -= alpha;
    double vnorm2 = 0;
    for (double e : v) vnorm2 += e * e;
    const double vnorm = std::sqrt(vnorm2);
    for (double& e : v) e /= vnorm;
    for (std::size_t j = k; j < n; ++j) {  // A[k:, k:] -= 2 v (vᵀ A[k:, k:])
      double dot = 0;
      for (std::size_t i = k; i < n; ++i) dot += v[i - k] * a[i * n + j];
      for (std::size_t i = k; i < n; ++i) a[i * n + j] -= 2.0 * v[i - k] * dot;
    }
    r_diag[k] = alpha;
    reflectors[k] = std::move(v);
  }
  // Q = H_0 (H_1 (… (H_{n−1} I))).
  std::vector<double> q(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i) q[i * n + i] = 1.0;
  for (std::size_t k = n; k-- > 0;) {
    const auto& v = reflectors[k];
    if (v.empty()) continue;
    for (std::size_t j = 0; j < n; ++j) {
      double dot = 0;
      for (std::size_t i = k; i < n; ++i) dot += v[i - k] * q[i * n + j];
      for (std::size_t i = k; i < n; ++i) q[i * n + j] -= 2.0 * v[i - k] * dot;
    }
  }
  // Column signs by sign(diag R): makes Q unique, hence Haar distributed (Mezzadri 2007).
  for (std::size_t j = 0; j < n; ++j)
    if (r_diag[j] < 0)
      for (std::size_t i = 0; i < n; ++i) q[i * n + j] = -q[i * n + j];
  return q;
}

TurboQuantCodec make_turboquant_codec(int dim, int bits, std::uint64_t seed) {
  return make_turboquant_codec(dim, bits, seed, TurboQuantRotation::automatic);
}

TurboQuantCodec make_turboquant_codec(int dim, int bits, std::uint64_t seed, TurboQuantRotation rotation) {
  require_dim(dim);
  require_bits(bits);
  TurboQuantCodec codec;
  codec.dim = dim;
  codec.bits = bits;
  for (double c : turboquant_codebook(dim, bits)) codec.codebook.push_back(static_cast<float>(c));
  if (rotation == TurboQuantRotation::automatic)
    rotation = is_power_of_two(dim) ? TurboQuantRotation::hadamard : TurboQuantRotation::dense;
  switch (rotation) {
    case TurboQuantRotation::hadamard: codec.signs = turboquant_rht_signs(dim, seed); break;
    case TurboQuantRotation::dense:
      for (double q : turboquant_haar_rotation(dim, seed)) codec.rotation.push_back(static_cast<float>(q));
      break;
    case TurboQuantRotation::identity:
      codec.rotation.assign(static_cast<std::size_t>(dim) * static_cast<std::size_t>(dim), 0.0f);
      for (int i = 0; i < dim; ++i) codec.rotation[static_cast<std::size_t>(i) * static_cast<std::size_t>(dim + 1)] = 1;
      break;
    case TurboQuantRotation::automatic: break;
  }
  return codec;
}

void validate_turboquant_codec(const TurboQuantCodec& codec, std::int64_t width) {
  require_dim(codec.dim);
  require_bits(codec.bits);
  const auto dim = static_cast<std::size_t>(codec.dim);
  KVLAB_REQUIRE(codec.codebook.size() == (std::size_t{1} << codec.bits), invalid_argument, "TurboQuant codebook has ",
                codec.codebook.size(), " levels but bits ", codec.bits, " needs ", 1 << codec.bits);
  for (std::size_t k = 0; k < codec.codebook.size(); ++k) {
    KVLAB_REQUIRE(std::isfinite(codec.codebook[k]) && (k == 0 || codec.codebook[k - 1] <= codec.codebook[k]),
                  invalid_argument, "TurboQuant codebook level ", k, " = ", codec.codebook[k],
                  " is not finite and ascending");
  }
  const bool rht = !codec.signs.empty(), dense = !codec.rotation.empty();
  KVLAB_REQUIRE(rht != dense, invalid_argument, "TurboQuant codec needs exactly one rotation, got ", codec.signs.size(),
                " signs and ", codec.rotation.size(), " dense entries");
  if (rht) {
    KVLAB_REQUIRE(is_power_of_two(codec.dim) && codec.signs.size() == dim, invalid_argument, "TurboQuant RHT has ",
                  codec.signs.size(), " signs for dim ", codec.dim, " (needs a power of two and one sign per channel)");
    for (std::size_t i = 0; i < dim; ++i)
      KVLAB_REQUIRE(codec.signs[i] == 1.0f || codec.signs[i] == -1.0f, invalid_argument, "TurboQuant RHT sign ", i,
                    " = ", codec.signs[i], " is not ±1");
  } else {
    KVLAB_REQUIRE(codec.rotation.size() == dim * dim, invalid_argument, "TurboQuant dense rotation has ",
                  codec.rotation.size(), " entries, dim ", codec.dim, " needs ", dim * dim);
  }
  if (codec.channels.empty()) return;
  KVLAB_REQUIRE(codec.channels.size() == dim, invalid_argument, "TurboQuant codec has ", codec.channels.size(),
                " channels but dim ", codec.dim);
  std::set<std::int32_t> seen;
  for (std::size_t j = 0; j < dim; ++j) {
    const std::int32_t ch = codec.channels[j];
    KVLAB_REQUIRE(ch >= 0 && (width <= 0 || ch < width), invalid_argument, "TurboQuant channel ", ch, " (entry ", j,
                  ") is outside [0, ", width, ")");
    KVLAB_REQUIRE(seen.insert(ch).second, invalid_argument, "TurboQuant channel ", ch, " (entry ", j,
                  ") is repeated");
  }
}

// ---- rotation -------------------------------------------------------------------------

namespace {

// The rotations on raw storage with a caller-owned scratch row: the kernels call them
// once per vector, so they must not allocate.
void rotate_into(const TurboQuantCodec& codec, double* v, double* scratch) {
  const auto n = static_cast<std::size_t>(codec.dim);
  if (!codec.signs.empty()) {  // y = H(signs ⊙ u)/√D
    for (std::size_t i = 0; i < n; ++i) v[i] *= codec.signs[i];
    fwht({v, n});
    const double scale = std::sqrt(static_cast<double>(n));
    for (std::size_t i = 0; i < n; ++i) v[i] /= scale;
    return;
  }
  const float* q = codec.rotation.data();  // y = Q u (mlx-vlm: u · Qᵀ)
  for (std::size_t i = 0; i < n; ++i) {
    double acc = 0;
    for (std::size_t j = 0; j < n; ++j) acc += static_cast<double>(q[i * n + j]) * v[j];
    scratch[i] = acc;
  }
  std::copy(scratch, scratch + n, v);
}

void unrotate_into(const TurboQuantCodec& codec, double* v, double* scratch) {
  const auto n = static_cast<std::size_t>(codec.dim);
  if (!codec.signs.empty()) {  // u = signs ⊙ H(y)/√D
    fwht({v, n});
    const double scale = std::sqrt(static_cast<double>(n));
    for (std::size_t i = 0; i < n; ++i) v[i] = v[i] / scale * codec.signs[i];
    return;
  }
  // u = Qᵀ y of the very matrix the encoder used (f32 entries), so encode and decode
  // share one basis even though the f32 Q is orthogonal only to ~dim·2^-24.
  const float* q = codec.rotation.data();
  std::fill(scratch, scratch + n, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) scratch[j] += static_cast<double>(q[i * n + j]) * v[i];
  std::copy(scratch, scratch + n, v);
}

}  // namespace

void turboquant_rotate(const TurboQuantCodec& codec, std::span<double> v) {
  KVLAB_REQUIRE(v.size() == static_cast<std::size_t>(codec.dim), shape_mismatch, "rotate: ", v.size(),
                " values for dim ", codec.dim);
  std::vector<double> scratch(v.size());
  rotate_into(codec, v.data(), scratch.data());
}

void turboquant_unrotate(const TurboQuantCodec& codec, std::span<double> v) {
  KVLAB_REQUIRE(v.size() == static_cast<std::size_t>(codec.dim), shape_mismatch, "unrotate: ", v.size(),
                " values for dim ", codec.dim);
  std::vector<double> scratch(v.size());
  unrotate_into(codec, v.data(), scratch.data());
}

// ---- kernels --------------------------------------------------------------------------

void turboquant_encode(const ConstTensorView& x, const TurboQuantCodec& codec, const TensorView& norms,
                       const TensorView& indices) {
  require_vectors(x, codec, "turboquant_encode input x");
  const Shape lead = shape_leading(x.shape);
  require_norms(norms, lead, "turboquant_encode");
  const std::int64_t words = packed_word_count(codec.dim, codec.bits);
  require_dtype(indices, DType::u32, "turboquant_encode indices");
  require_shape(indices, shape_appended(lead, words), "turboquant_encode indices");
  const std::int64_t rows = shape_numel(lead), width = x.shape.back();
  const std::vector<double> mids = midpoints(codec);
  std::vector<double> u(static_cast<std::size_t>(codec.dim)), scratch(u.size());
  std::vector<std::uint8_t> codes(u.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double sum_sq = 0;
    for (int j = 0; j < codec.dim; ++j) {
      const double e = x.load(r * width + channel(codec, j));
      u[static_cast<std::size_t>(j)] = e;
      sum_sq += e * e;
    }
    const float norm = static_cast<float>(std::sqrt(sum_sq));  // the f32 norm mlx computes
    norms.store(r, norm);                                       // rounded once more, to f16
    const double denom = std::max(static_cast<double>(norm), kNormFloor);
    for (double& e : u) e /= denom;
    rotate_into(codec, u.data(), scratch.data());
    for (std::size_t j = 0; j < u.size(); ++j) {
      // #{m : y > mid_m}: lower_bound finds the first midpoint >= y, so ties go low.
      codes[j] = static_cast<std::uint8_t>(std::lower_bound(mids.begin(), mids.end(), u[j]) - mids.begin());
    }
    pack_codes(codes, codec.bits,
               std::span<std::uint32_t>(indices.as<std::uint32_t>() + r * words, static_cast<std::size_t>(words)));
  }
}

void turboquant_decode(const ConstTensorView& norms, const ConstTensorView& indices, const TurboQuantCodec& codec,
                       const TensorView& out) {
  require_vectors(out, codec, "turboquant_decode output");
  const Shape lead = shape_leading(out.shape);
  require_norms(norms, lead, "turboquant_decode");
  const std::int64_t words = packed_word_count(codec.dim, codec.bits);
  require_dtype(indices, DType::u32, "turboquant_decode indices");
  require_shape(indices, shape_appended(lead, words), "turboquant_decode indices");
  const std::int64_t rows = shape_numel(lead), width = out.shape.back();
  std::vector<double> y(static_cast<std::size_t>(codec.dim)), scratch(y.size());
  std::vector<std::uint8_t> codes(y.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    unpack_codes(std::span<const std::uint32_t>(indices.as<const std::uint32_t>() + r * words,
                                                static_cast<std::size_t>(words)),
                 codec.bits, codes);
    for (std::size_t j = 0; j < y.size(); ++j) y[j] = codec.codebook[codes[j]];
    unrotate_into(codec, y.data(), scratch.data());
    const double norm = norms.load(r);
    // double -> f32 -> out.dtype is one correct rounding: 24 >= 2·11 + 2 bits makes the
    // intermediate f32 rounding innocuous for f16 and bf16 (Figueroa 1995).
    for (int j = 0; j < codec.dim; ++j)
      out.store(r * width + channel(codec, j), static_cast<float>(norm * y[static_cast<std::size_t>(j)]));
  }
}

}  // namespace kvlab::ref
