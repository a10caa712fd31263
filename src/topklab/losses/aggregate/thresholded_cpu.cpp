// The fused kernel of the thresholded aggregates (MATk, STk) on the CPU, with its autograd node in
// C++: one pass over each row of losses gives the value, the gradient in the losses and the
// gradient in λ; the backward only scales them. The formulas and their per-element rounding are
// those of topklab/losses/aggregate/kernels.py and topklab/smoothing.py (built with
// -ffp-contract=off, so no multiply-add is fused); the row sums accumulate in double (for double
// losses, the mean of φ with each term divided by n first). Also Average's and ATk's node for one row
// of losses (top_mean_row: aten's sums, the torch expressions' bits).
// Prebuilt with the package (setup.py: the wheel, `pip install -e .`), else built on first use; both through
// topklab.utils.native.load_native (topklab.losses.aggregate.kernels.native_extension). The hot loops are
// compiled for AVX-512, AVX2 and the baseline, chosen when the library loads (target_clones).
#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#ifndef TOPKLAB_SOURCE_SHA
#define TOPKLAB_SOURCE_SHA ""  // a build on first use: the source it was built from is the one beside it
#endif
#ifndef TOPKLAB_TORCH_VERSION
#define TOPKLAB_TORCH_VERSION ""
#endif
#define TOPKLAB_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace {

enum Smoothing : int64_t { kSReLU = 0, kReLU = 1, kELU = 2, kSoftplus = 3, kLeakyReLU = 4 };

// |x| from which SReLU's root is |x| (smoothing.py's beyond_square): 2^63 in float, 2^511 in double.
template <typename T>
constexpr T beyond_square() {
  T big = T(1);
  for (int i = 0; i < std::numeric_limits<T>::max_exponent / 2 - 1; ++i) big *= T(2);
  return big;
}

// φ(x) (for SReLU: ½x + ½√(x²+δ²), the row mean is finished outside) and step·φ'(x).
template <typename T, int64_t S>
inline void term(T x, T dd, T step, T half, T zero, T& phi, T& slope) {
  if constexpr (S == kSReLU) {
    // Ordinary x: the formulas of smoothing.py, bit for bit. Beyond ±big (±inf included) the slope is
    // that at ±big (step or 0, to rounding) and the root is |x|. Selecting the root by comparing |x|
    // with big made this loop 7× slower; these selects cost about a third more than the plain formula.
    constexpr T big = beyond_square<T>();
    const T low = x < -big ? -big : x;  // −inf → −big; NaN stays NaN
    const T bounded = low > big ? big : low;
    const T bounded_root = std::sqrt(bounded * bounded + dd);
    const T size = std::abs(low);
    const T root = bounded_root < size ? size : bounded_root;
    const T vx = (half / (T(2) * bounded_root)) * bounded;
    phi = T(0.5) * low + T(0.5) * root;
    slope = half + vx + vx;
  } else if constexpr (S == kReLU) {
    phi = x <= T(0) ? zero : x;  // NaN stays NaN, as in torch's relu
    slope = x > T(0) ? step : zero;
  } else if constexpr (S == kELU) {
    phi = x > T(0) ? x : std::expm1(x);
    slope = x > T(0) ? step : step * std::exp(x);
  } else if constexpr (S == kSoftplus) {
    T z = std::exp(x);
    phi = x > T(20) ? x : std::log1p(z);
    slope = x > T(20) ? step : step * z / (z + T(1));
  } else {
    phi = x > T(0) ? x : x * T(0.01);
    slope = x > T(0) ? step : step * T(0.01);
  }
}

template <typename T, int64_t S, bool kGrads>
TOPKLAB_CLONES void rows(const T* losses, const T* lam, const T* delta, const T* k, const T* scale, int64_t P, int64_t n,
          T* value, T* grad, T* grad_lam, double* slope_sums = nullptr) {
  for (int64_t p = 0; p < P; ++p) {
    const T* row = losses + p * n;
    T* grad_row = kGrads ? grad + p * n : nullptr;
    const T lm = lam[p], d = delta[p], s = scale[p], dd = d * d;
    const T step = s / T(n), half = step * T(0.5);
    // double sums of float terms cannot overflow; double terms are divided by n first
    const double per_term = std::is_same_v<T, double> ? 1.0 / double(n) : 1.0;
    double sum_phi = 0.0, sum_slope = 0.0;
    // A zero the compiler cannot see: with the literal, GCC turned ReLU's select into a branch around the
    // double sum, and the loop ran scalar (6× slower than SReLU's).
    T zero = T(0);
    __asm__("" : "+m"(zero));
#pragma omp simd reduction(+ : sum_phi, sum_slope)
    for (int64_t i = 0; i < n; ++i) {
      T phi, slope;
      term<T, S>(row[i] - lm, dd, step, half, zero, phi, slope);
      sum_phi += double(phi) * per_term;
      if constexpr (kGrads) {
        grad_row[i] = slope;
        sum_slope += double(slope);
      }
    }
    const double mean_phi = std::is_same_v<T, double> ? sum_phi : sum_phi / double(n);
    const T hinge = S == kSReLU ? T(mean_phi) - T(0.5) * d : T(mean_phi);
    value[p] = (hinge + k[p] / T(n) * lm) * s;
    if constexpr (kGrads) grad_lam[p] = -T(sum_slope) + s * (k[p] / T(n));
    if (slope_sums != nullptr) slope_sums[p] = sum_slope;
  }
}

template <typename T, bool kGrads>
void dispatch(int64_t smoothing, const T* l, const T* lam, const T* d, const T* k, const T* s, int64_t P, int64_t n,
              T* value, T* grad, T* grad_lam, double* slope_sums = nullptr) {
  switch (smoothing) {
    case kSReLU: return rows<T, kSReLU, kGrads>(l, lam, d, k, s, P, n, value, grad, grad_lam, slope_sums);
    case kReLU: return rows<T, kReLU, kGrads>(l, lam, d, k, s, P, n, value, grad, grad_lam, slope_sums);
    case kELU: return rows<T, kELU, kGrads>(l, lam, d, k, s, P, n, value, grad, grad_lam, slope_sums);
    case kSoftplus: return rows<T, kSoftplus, kGrads>(l, lam, d, k, s, P, n, value, grad, grad_lam, slope_sums);
    case kLeakyReLU: return rows<T, kLeakyReLU, kGrads>(l, lam, d, k, s, P, n, value, grad, grad_lam, slope_sums);
    default: TORCH_CHECK(false, "unknown smoothing id ", smoothing);
  }
}

// (value (P,), ∂/∂losses (P, n) or undefined, ∂/∂λ (P,) or undefined)
std::vector<at::Tensor> run(const at::Tensor& losses_in, const at::Tensor& lam_in, const at::Tensor& delta_in,
                            const at::Tensor& k_in, const at::Tensor& scale_in, int64_t smoothing, bool grads) {
  TORCH_CHECK(losses_in.device().is_cpu() && losses_in.dim() == 2, "losses must be a (P, n) CPU tensor");
  auto losses = losses_in.detach().contiguous();
  auto prepare = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.dim() == 1 && t.size(0) == losses.size(0), name, " must have one entry per row");
    return t.detach().to(losses.scalar_type()).contiguous();
  };
  auto lam = prepare(lam_in, "lam"), delta = prepare(delta_in, "delta"), k = prepare(k_in, "k"),
       scale = prepare(scale_in, "scale");
  const int64_t P = losses.size(0), n = losses.size(1);
  auto value = at::empty({P}, losses.options());
  at::Tensor grad = grads ? at::empty_like(losses) : at::Tensor();
  at::Tensor grad_lam = grads ? at::empty({P}, losses.options()) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(losses.scalar_type(), "thresholded_cpu", [&] {
    auto args = std::make_tuple(losses.data_ptr<scalar_t>(), lam.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(),
                                k.data_ptr<scalar_t>(), scale.data_ptr<scalar_t>());
    if (grads) {
      dispatch<scalar_t, true>(smoothing, std::get<0>(args), std::get<1>(args), std::get<2>(args), std::get<3>(args),
                               std::get<4>(args), P, n, value.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(),
                               grad_lam.data_ptr<scalar_t>());
    } else {
      dispatch<scalar_t, false>(smoothing, std::get<0>(args), std::get<1>(args), std::get<2>(args), std::get<3>(args),
                                std::get<4>(args), P, n, value.data_ptr<scalar_t>(), nullptr, nullptr);
    }
  });
  return {value, grad, grad_lam};
}

// Whether a 0-d or one-element CPU tensor can be read in place: its own dense memory, no pending negation.
bool readable_in_place(const at::Tensor& t) {
  return t.is_cpu() && t.has_storage() && !t.is_neg() && !t._is_zerotensor();
}

// Whether a CPU tensor's one element is ±inf (read in place: no dispatch).
bool one_is_inf(const at::Tensor& t) {
  if (!readable_in_place(t)) return std::isinf(t.item<double>());
  bool inf = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "one_is_inf",
                                  [&] { inf = std::isinf(double(t.data_ptr<scalar_t>()[0])); });
  return inf;
}

bool all_ones(const at::Tensor& t) {
  if (t.numel() != 1) return at::all(t == 1).item<bool>();
  if (!readable_in_place(t)) return t.item<double>() == 1.0;
  bool one = false;  // read in place: a 0-d CPU gradient needs no dispatch
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "all_ones",
                                  [&] { one = double(t.data_ptr<scalar_t>()[0]) == 1.0; });
  return one;
}

// The fused node's backward: the gradients its forward saved (in the losses, in λ), times the incoming
// gradient (per row; the losses' factor g_rows, g broadcast over each row), skipped where it is one everywhere.
std::pair<at::Tensor, at::Tensor> saved_times(torch::autograd::AutogradContext* ctx, const at::Tensor& g,
                                              const at::Tensor& g_rows) {
  auto saved = ctx->get_saved_variables();
  if (all_ones(g)) return {saved[0], saved[1]};
  return {saved[0] * g_rows, saved[1] * g};
}

struct Thresholded : public torch::autograd::Function<Thresholded> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& losses, const at::Tensor& lam,
                            const at::Tensor& delta, const at::Tensor& k, const at::Tensor& scale, int64_t smoothing) {
    auto out = run(losses, lam, delta, k, scale, smoothing, true);
    ctx->save_for_backward({out[1], out[2]});
    return out[0];
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_value) {
    const auto [grad, grad_lam] = saved_times(ctx, grad_value[0], grad_value[0].unsqueeze(1));
    return {ctx->needs_input_grad(0) ? grad : at::Tensor(), ctx->needs_input_grad(1) ? grad_lam : at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor thresholded(const at::Tensor& losses, const at::Tensor& lam, const at::Tensor& delta, const at::Tensor& k,
                       const at::Tensor& scale, int64_t smoothing) {
  return Thresholded::apply(losses, lam, delta, k, scale, smoothing);
}

// solve.py's power_law_step: Newton's step on the count's gap to the nearer end raised to q = 1/p, its local
// power law read off the gap's first two derivatives; q above solve.py's NEWTON_ABOVE = ½ taken as 1 (Newton's
// step), below −½ as −½ (change one, change both).
template <typename T>
T power_law_step(T count, T excess, T k, T n, T bend, T change) {
  const bool below = excess > T(0);
  const T gap = below ? n - count : count, target = below ? n - k : k, sign = below ? T(1) : T(-1);
  T q = T(1) - sign * (gap / bend) * (change / bend);
  q = q > T(0.5) ? T(1) : (q < T(-0.5) ? T(-0.5) : q);  // NaN stays NaN: the solve then bisects
  const T log_ratio = std::log(target / gap), x = q * log_ratio;
  const T relative = std::abs(x) < T(1e-6) ? T(1) + T(0.5) * x : std::expm1(x) / x;
  return sign * gap / bend * log_ratio * relative;
}

// One loss's terms of a solve step's sums at λ: SReLU'(z), SReLU''(z) and the change of the count's gap's
// curvature (solve.py's srelu_slope_and_curvature, curvature_change), z = v − λ clamped to ±big.
template <typename T>
[[gnu::always_inline]] inline void solve_terms(T v, T lam, T dd, double& count, double& curvature, double& change) {
  constexpr T big = beyond_square<T>();
  T z = v - lam;
  z = z < -big ? -big : (z > big ? big : z);
  const T root = std::sqrt(z * z + dd);
  const T slope = z < T(0) ? dd / (T(2) * root * (root - z)) : T(0.5) * (T(1) + z / root);
  const T bend = T(0.5) * dd / (root * root * root);
  count += double(slope);
  curvature += double(bend);
  change += double(T(3) * bend * (z / (z * z + dd)));
}

// λ per row with Σ_i SReLU'_δ(ℓ_i − λ) ≈ k: solve.py's solve_srelu_threshold (the same bracket, safeguarded
// power-law steps and best iterate), each step one pass over the row with double sums and no temporaries. The
// first pass also scans the row for its bracket, evaluating at the warm start; where the warm start lies
// outside the bracket, the clamped start is evaluated in a pass of its own.
template <typename T>
TOPKLAB_CLONES void solve_rows(const T* losses, const T* k, const T* delta, const T* start, int64_t P, int64_t n, int64_t steps,
                T* lam_out, T* count_out) {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  for (int64_t p = 0; p < P; ++p) {
    const T* row = losses + p * n;
    const T d = delta[p], dd = d * d, kp = k[p], warm = start[p];
    T least = inf, most = -inf;
    int64_t above = 0, nans = 0;
    double count = 0.0, curvature = 0.0, change = 0.0;
#pragma omp simd reduction(min : least) reduction(max : most) reduction(+ : above, nans, count, curvature, change)
    for (int64_t i = 0; i < n; ++i) {
      const T v = row[i];
      const bool finite = std::isfinite(v);
      nans += v != v;
      above += v == inf;
      least = std::min(least, finite ? v : inf);
      most = std::max(most, finite ? v : -inf);
      solve_terms(v, warm, dd, count, curvature, change);
    }
    if (nans > 0) {
      lam_out[p] = nan;
      count_out[p] = nan;
      continue;
    }
    if (least > most) least = most = T(0);  // no finite loss
    const T lower_gap = T(n) - kp < T(0.5) ? T(0.5) : T(n) - kp, upper_gap = kp - T(above) < T(0.5) ? T(0.5) : kp - T(above);
    T low = least - d * std::sqrt(T(n) / lower_gap), high = most + d * std::sqrt(T(n) / upper_gap);
    T lam = std::min(std::max(warm, low), high);
    bool evaluated = lam == warm;  // the scan's sums are those at λ
    T best = lam, best_excess = inf, best_count = T(n);
    for (int64_t step = 0; step <= steps; ++step) {
      if (!evaluated) {
        count = curvature = change = 0.0;
#pragma omp simd reduction(+ : count, curvature, change)
        for (int64_t i = 0; i < n; ++i) solve_terms(row[i], lam, dd, count, curvature, change);
      }
      evaluated = false;
      const T excess = T(count) - kp;
      if (std::abs(excess) < best_excess) {
        best = lam;
        best_excess = std::abs(excess);
        best_count = T(count);
      }
      if (excess > T(0)) low = lam; else high = lam;
      const T proposal = lam + power_law_step(T(count), excess, kp, T(n), T(curvature), T(change));
      lam = proposal > low && proposal < high ? proposal : T(0.5) * (low + high);
    }
    lam_out[p] = best;
    count_out[p] = best_count;
  }
}

// (λ (P,), smoothed count above λ (P,)) of losses (P, n) at counts k, widths δ, warm starts start (each (P,)).
std::vector<at::Tensor> solve_srelu(const at::Tensor& losses_in, const at::Tensor& k_in, const at::Tensor& delta_in,
                                    const at::Tensor& start_in, int64_t steps) {
  TORCH_CHECK(losses_in.device().is_cpu() && losses_in.dim() == 2, "losses must be a (P, n) CPU tensor");
  auto losses = losses_in.detach().contiguous();
  auto prepare = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.dim() == 1 && t.size(0) == losses.size(0), name, " must have one entry per row");
    return t.detach().to(losses.scalar_type()).contiguous();
  };
  auto k = prepare(k_in, "k"), delta = prepare(delta_in, "delta"), start = prepare(start_in, "start");
  const int64_t P = losses.size(0), n = losses.size(1);
  auto lam = at::empty({P}, losses.options()), count = at::empty({P}, losses.options());
  AT_DISPATCH_FLOATING_TYPES(losses.scalar_type(), "solve_srelu_cpu", [&] {
    solve_rows<scalar_t>(losses.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(),
                         start.data_ptr<scalar_t>(), P, n, steps, lam.data_ptr<scalar_t>(), count.data_ptr<scalar_t>());
  });
  return {lam, count};
}

// ---- The fast lane of a module's call on one row (thresholded.py's ThresholdedTopK._one_row) ----
// The same passes as rows() and solve_rows() with P = 1, and the module's bookkeeping (the warm start, the
// running average, the λ monitor's sums) in the float operations the Python path does them in, so that a
// call here equals the Python path's bit for bit (tests/losses/test_fast_lane.py); one call from Python.

// The monitor's record() (lambda_monitor.py) of one call: state = [calls, share_sum, in_band_all, counted,
// in_band, (3 sampled sums), seen, streak] in double; the band compares the share in its own dtype.
template <typename T>
void record_call(double* state, T share, double k, double n, double burn_in) {
  constexpr int kSeen = 8, kStreak = 9;
  const double share64 = double(share);
  if (k < n) {
    const double target = k / n, target_below = 1.0 - target;
    const T below = T(1) - share;
    const bool band = share <= T(2 * target) && share >= T(target / 2) && below <= T(2 * target_below) &&
                      below >= T(target_below / 2);
    const double good = band ? 1.0 : 0.0, counted = state[kSeen] + 1.0 > burn_in ? 1.0 : 0.0, kept = 1.0 - good;
    const double added[10] = {1.0, share64, good, counted, good * counted, 0.0, 0.0, 0.0, 1.0, kept};
    state[kStreak] *= kept;
    for (int i = 0; i < 10; ++i) state[i] += added[i];
  } else {
    const double added[10] = {1.0, share64, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0};
    for (int i = 0; i < 10; ++i) state[i] += added[i];
  }
}

// From this many losses on, ℓ_[k] is selected among the losses that share its top 16 key bits (found by a
// histogram pass) rather than among all of them: 4–5× faster at 1e5–1e7.
constexpr int64_t kRadixMinN = 65536;

template <typename T>
struct UnsignedOf;
template <>
struct UnsignedOf<float> {
  using type = uint32_t;
};
template <>
struct UnsignedOf<double> {
  using type = uint64_t;
};

// An unsigned key of a non-NaN value in the values' order: negatives have every bit flipped, others the sign bit set.
template <typename T>
inline typename UnsignedOf<T>::type order_key(T v) {
  using U = typename UnsignedOf<T>::type;
  U bits;
  std::memcpy(&bits, &v, sizeof(T));
  constexpr U sign = U(1) << (8 * sizeof(T) - 1);
  return (bits & sign) ? ~bits : (bits | sign);
}

// ℓ_[k], the k-th largest of row (n,), NaN ranked largest as kthvalue ranks it, clamped to the finite losses'
// range [least, most] as solve.py's kth_largest() does (nans: the row's NaN count; least > most: no finite
// loss): a selection on a copy of the losses, or from kRadixMinN losses on, of those in ℓ_[k]'s histogram
// bucket (two tables, alternate losses, so that equal neighbours do not wait on each other's count).
template <typename T>
T kth_in_range(const T* row, int64_t n, int64_t k, int64_t nans, T least, T most) {
  constexpr int kShift = 8 * sizeof(T) - 16;
  constexpr int64_t kBuckets = int64_t(1) << 16;
  if (nans >= k) return std::numeric_limits<T>::quiet_NaN();
  int64_t rank = k - nans;  // ℓ_[k]'s rank from the top among the losses that are not NaN
  std::vector<T> kept;
  if (n < kRadixMinN || n > int64_t(std::numeric_limits<uint32_t>::max())) {
    kept.reserve(n - nans);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isnan(row[i])) kept.push_back(row[i]);
  } else {
    std::vector<uint32_t> counts(2 * kBuckets, 0);
    uint32_t* even = counts.data();
    uint32_t* odd = even + kBuckets;
    int64_t i = 0;
    if (nans == 0) {
      for (; i + 1 < n; i += 2) {
        ++even[order_key(row[i]) >> kShift];
        ++odd[order_key(row[i + 1]) >> kShift];
      }
    }
    for (; i < n; ++i)
      if (!std::isnan(row[i])) ++even[order_key(row[i]) >> kShift];
    int64_t bucket = kBuckets - 1;
    for (; int64_t(even[bucket]) + odd[bucket] < rank; --bucket) rank -= int64_t(even[bucket]) + odd[bucket];
    kept.reserve(int64_t(even[bucket]) + odd[bucket]);
    for (int64_t j = 0; j < n; ++j) {
      const T v = row[j];
      if (!std::isnan(v) && int64_t(order_key(v) >> kShift) == bucket) kept.push_back(v);
    }
  }
  auto nth = kept.begin() + (rank - 1);
  std::nth_element(kept.begin(), nth, kept.end(), std::greater<T>());
  return least <= most ? std::min(std::max(*nth, least), most) : *nth;
}

// kth_near() selects near λ where ℓ_[k]'s rank m from λ is at most 1/kNearShare of its side's losses, and widens its
// window of λ kNearTries times, by kNearGrowth each, before it selects among all losses.
constexpr int64_t kNearShare = 256;
constexpr int kNearTries = 3;
constexpr double kNearGrowth = 8.0;

// ℓ_[k] as kth_in_range() gives it, found near λ, with the count of losses above λ: one pass counts the
// losses above λ (and the NaN, and the finite range), which says on which side of λ ℓ_[k] lies and its rank m
// from λ there; a second gathers that side's losses within a window of λ expected to hold about 4m of them (its
// width from the side's range, as if evenly spread), and ℓ_[k] is selected among them. The window holds the
// side's losses nearest λ (v − λ is monotone in v), so any window with at least m of them holds ℓ_[k]; one with
// fewer is widened, and after kNearTries kth_in_range() selects among all (with this pass's range). Where λ
// tracks ℓ_[k], m is small, and the two passes take about a fifth of a selection among all at 1e6 losses.
template <typename T>
T kth_near(const T* row, int64_t n, int64_t k, T lam, int64_t& above) {
  constexpr int64_t kBlock = 4096, kChunk = 64;  // int32 counts per block; the gather's test per chunk
  const T inf = std::numeric_limits<T>::infinity();
  int64_t nans = 0, count = 0;
  T least = inf, most = -inf;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    int32_t block_nans = 0, block_count = 0;
#pragma omp simd reduction(min : least) reduction(max : most) reduction(+ : block_nans, block_count)
    for (int64_t i = start; i < end; ++i) {
      const T v = row[i];
      const bool finite = std::isfinite(v);
      block_nans += v != v;
      block_count += v > lam;
      least = std::min(least, finite ? v : inf);
      most = std::max(most, finite ? v : -inf);
    }
    nans += block_nans;
    count += block_count;
  }
  above = count;
  const int64_t rank = k - nans;  // ℓ_[k]'s rank from the top among the losses that are not NaN
  if (rank <= 0 || !std::isfinite(lam) || least > most) return kth_in_range(row, n, k, nans, least, most);
  const bool upper = count >= rank;  // ℓ_[k] is the m-th smallest above λ, else the m-th largest at or below it
  const int64_t side = upper ? count : n - nans - count, m = upper ? count - rank + 1 : rank - count;
  const T span = upper ? most - lam : lam - least;
  if (!(span > T(0)) || kNearShare * m > side) return kth_in_range(row, n, k, nans, least, most);
  // the side's losses within width of λ into kept: a test per chunk (vectorized), the gather only where it holds
  const auto gather = [&](auto side_above, T width, std::vector<T>& kept) {
    constexpr bool kAbove = decltype(side_above)::value;
    const auto inside = [&](T v) { return int(kAbove ? v > lam : v <= lam) & int((kAbove ? v - lam : lam - v) <= width); };
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t end = std::min(n, start + kChunk);
      int hits = 0;
#pragma omp simd reduction(+ : hits)
      for (int64_t i = start; i < end; ++i) hits += inside(row[i]);
      if (hits > 0)
        for (int64_t i = start; i < end; ++i)
          if (inside(row[i])) kept.push_back(row[i]);
    }
  };
  T width = span * T(double(4 * m + 16) / double(side));
  std::vector<T> kept;
  for (int tries = 0; tries < kNearTries; ++tries, width *= T(kNearGrowth)) {
    kept.clear();
    if (upper) gather(std::true_type{}, width, kept);
    else gather(std::false_type{}, width, kept);
    if (int64_t(kept.size()) >= m) {
      const auto nth = kept.begin() + (m - 1);
      if (upper) std::nth_element(kept.begin(), nth, kept.end());
      else std::nth_element(kept.begin(), nth, kept.end(), std::greater<T>());
      return std::min(std::max(*nth, least), most);
    }
  }
  return kth_in_range(row, n, k, nans, least, most);
}

// The monitor's sample of a call (thresholded.py's _sampler): adds the share of losses above λ and λ − ℓ_[k]
// to state[5] and state[6], and one to state[7].
template <typename T>
void sample_call(double* state, const T* row, int64_t n, T lam, int64_t k) {
  int64_t above = 0;
  const T kth = kth_near(row, n, k, lam, above);
  state[5] += double(above) / double(n);
  state[6] += double(T(lam - kth));
  state[7] += 1.0;
}

// The backward of a row's node that saved only its gradient in the losses: that gradient times the incoming
// one (skipped where it is one), and nothing for the node's other inputs (at most 11).
torch::autograd::variable_list saved_gradient_times(torch::autograd::AutogradContext* ctx, const at::Tensor& g) {
  const at::Tensor grad = ctx->get_saved_variables()[0];
  torch::autograd::variable_list out(12);
  out[0] = all_ones(g) ? grad : grad * g;
  return out;
}

// MATk at λ = ℓ_[k] (lambda_rules.py's split_tie_mass): ReLU's slope at 0 is 0, so the losses tied at λ get the
// gradient mass k − #{ℓ > λ} of (k/n)·ATk's in equal parts, step·((k − above)/ties) each.
template <typename T>
void split_tie_mass(const T* row, int64_t n, T lam, T k, T step, T* grad) {
  int64_t above = 0, ties = 0;
  for (int64_t i = 0; i < n; ++i) {
    above += row[i] > lam;
    ties += row[i] == lam;
  }
  if (ties == 0) return;
  const T mass = step * ((k - T(above)) / T(ties));
  for (int64_t i = 0; i < n; ++i)
    if (row[i] == lam) grad[i] += mass;
}

// value (0-d) of losses (n,) at λ (0-d, any float dtype), differentiable in both; the backward only scales.
struct RowThresholded : public torch::autograd::Function<RowThresholded> {
  // state (optional): the λ monitor's sums, where this call records its smoothed share Σ φ'/n (from the pass's
  // own sum of the gradients: lambda_monitor.py's share to rounding)
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& losses_in, const at::Tensor& lam,
                            double delta, double k, double scale, int64_t smoothing,
                            const std::optional<at::Tensor>& state = std::nullopt, double burn_in = 0.0,
                            bool sample = false) {
    const bool grads = ctx != nullptr;
    const at::Tensor losses = losses_in.contiguous();
    at::Tensor value = at::empty({}, losses.options());
    at::Tensor grad = grads ? at::empty_like(losses) : at::Tensor();
    at::Tensor grad_lam;
    AT_DISPATCH_FLOATING_TYPES(losses.scalar_type(), "row_thresholded_cpu", [&] {
      const scalar_t lm = lam.scalar_type() == losses.scalar_type() ? lam.data_ptr<scalar_t>()[0]
                                                                    : lam.to(losses.scalar_type()).data_ptr<scalar_t>()[0];
      const scalar_t d = scalar_t(delta), kk = scalar_t(k), s = scalar_t(scale);
      scalar_t gl = 0;
      double slope_sum = 0.0;
      if (grads) {
        dispatch<scalar_t, true>(smoothing, losses.data_ptr<scalar_t>(), &lm, &d, &kk, &s, 1, losses.size(0),
                                 value.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(), &gl, &slope_sum);
        grad_lam = at::scalar_tensor(gl, losses.options());
      } else {
        dispatch<scalar_t, false>(smoothing, losses.data_ptr<scalar_t>(), &lm, &d, &kk, &s, 1, losses.size(0),
                                  value.data_ptr<scalar_t>(), nullptr, nullptr, &slope_sum);
      }
      if (state.has_value()) {
        record_call<scalar_t>(state->data_ptr<double>(), scalar_t(slope_sum / scale), k, double(losses.size(0)), burn_in);
        if (sample) sample_call<scalar_t>(state->data_ptr<double>(), losses.data_ptr<scalar_t>(), losses.size(0), lm, int64_t(k));
      }
    });
    if (grads) {
      ctx->save_for_backward({grad, grad_lam});
      ctx->saved_data["lam_dtype"] = int64_t(lam.scalar_type());
    }
    return value;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_value) {
    const auto [grad, grad_lam] = saved_times(ctx, grad_value[0], grad_value[0]);
    const auto lam_dtype = static_cast<at::ScalarType>(ctx->saved_data["lam_dtype"].toInt());
    return {ctx->needs_input_grad(0) ? grad : at::Tensor(),
            ctx->needs_input_grad(1) ? grad_lam.to(lam_dtype) : at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// One training call of a solving rule on losses (n,): λ the root (SReLU: `steps` safeguarded steps from the warm start
// lam_last; ReLU, MATk: the k-th largest loss, selected near lam_last by kth_near(), where the losses tied at λ share
// the gradient mass ReLU's zero slope leaves out: split_tie_mass()), lam_last and the running average lam_avg
// (float32 buffers) updated as lambda_rules.py's store() does (left as they are where λ is not finite), the call
// recorded in the monitor's state, and the value at λ with its gradient in the losses (the fused kernel's, as
// RowThresholded's), which the backward only scales.
struct RowSolved : public torch::autograd::Function<RowSolved> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& losses_in, at::Tensor lam_avg,
                            at::Tensor lam_last, at::Tensor state, double k, double delta, double scale,
                            int64_t smoothing, double momentum, int64_t steps, double burn_in, bool sample) {
    TORCH_CHECK(lam_avg.scalar_type() == at::kFloat && lam_last.scalar_type() == at::kFloat,
                "λ buffers must be float32");
    TORCH_CHECK(smoothing == kSReLU || smoothing == kReLU, "a solved row_call solves SReLU's or ReLU's λ only");
    const bool grads = ctx != nullptr;
    const at::Tensor losses = losses_in.contiguous();
    const int64_t n = losses.size(0);
    at::Tensor value = at::empty({}, losses.options());
    at::Tensor grad = grads ? at::empty_like(losses) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES(losses.scalar_type(), "row_solved_cpu", [&] {
      const scalar_t* row = losses.data_ptr<scalar_t>();
      const scalar_t kk = scalar_t(k), d = scalar_t(delta), s = scalar_t(scale);
      scalar_t lam, share;
      if (smoothing == kSReLU) {
        const scalar_t start = scalar_t(lam_last.data_ptr<float>()[0]);
        scalar_t count;
        solve_rows<scalar_t>(row, &kk, &d, &start, 1, n, steps, &lam, &count);
        share = count / scalar_t(n);
      } else {
        int64_t above_start = 0;  // the count at the warm start; the share is at λ
        lam = kth_near(row, n, int64_t(k), scalar_t(lam_last.data_ptr<float>()[0]), above_start);
        int64_t at_least = 0;  // the gradient's share, the tied losses' mass included: min(#{ℓ >= λ}, k)/n
        for (int64_t i = 0; i < n; ++i) at_least += row[i] >= lam;
        share = std::min(scalar_t(at_least), kk) / scalar_t(n);
      }
      if (std::isfinite(lam)) {
        const float root = float(lam);
        float* avg = lam_avg.data_ptr<float>();
        lam_last.data_ptr<float>()[0] = root;
        avg[0] = float(1.0 - momentum) * avg[0] + float(momentum) * root;
      }
      record_call<scalar_t>(state.data_ptr<double>(), share, k, double(n), burn_in);
      if (sample) sample_call<scalar_t>(state.data_ptr<double>(), row, n, lam, int64_t(k));
      scalar_t grad_lam = 0;
      if (grads) {
        dispatch<scalar_t, true>(smoothing, row, &lam, &d, &kk, &s, 1, n, value.data_ptr<scalar_t>(),
                                 grad.data_ptr<scalar_t>(), &grad_lam);
        if (smoothing == kReLU) split_tie_mass(row, n, lam, kk, s / scalar_t(n), grad.data_ptr<scalar_t>());
      } else {
        dispatch<scalar_t, false>(smoothing, row, &lam, &d, &kk, &s, 1, n, value.data_ptr<scalar_t>(), nullptr,
                                  nullptr);
      }
    });
    if (grads) ctx->save_for_backward({grad});
    return value;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_value) {
    return saved_gradient_times(ctx, grad_value[0]);
  }
};

// ---- a tracked call (lambda_rules.py's Tracked.step, solve.py's srelu_threshold_step) ----
// A training call uses the λ that the previous call stepped to, and its one pass over the row gives the value,
// the gradient in the losses and the sums of the next safeguarded step: no pass before the value's.

// The sums of one tracking pass at λ. Per block of kTrackBlock losses the terms are summed in the losses' dtype,
// then the blocks in double: a loop whose every sum is in one dtype is vectorized for AVX2 as for AVX-512 (a
// double sum of float terms was not, and ran 5× slower), and six sums fit the registers (eight spilled to the
// stack and cost 1.5×). The count and curvature terms are bounded by 1 and ½/δ; φ's terms are scaled by a power
// of two (1/kTrackBlock, exact) so that no finite block sum overflows. The range is over every loss but NaN; a
// row with an infinite loss is scanned again for its finite range and its count of +inf (a NaN loss makes φ's
// sum NaN).
template <typename T>
struct TrackSums {
  double phi = 0.0, count = 0.0, curvature = 0.0, change = 0.0, infs = 0.0;
  double near_above = 0.0, near_below = 0.0;  // ReLU's: the losses in (λ, λ + w] and in (λ − w, λ]
  T least = std::numeric_limits<T>::infinity(), most = -std::numeric_limits<T>::infinity();
};

constexpr int64_t kTrackBlock = 256;

// The pass's range (over every loss but NaN) as the finite losses' range, and the count of +inf: a second scan
// only where the range holds an infinite loss.
template <typename T>
void finite_range(const T* row, int64_t n, T least, T most, TrackSums<T>& sums) {
  const T inf = std::numeric_limits<T>::infinity();
  if (least == -inf || most == inf) {
    least = inf;
    most = -inf;
    for (int64_t i = 0; i < n; ++i) {
      const T v = row[i];
      sums.infs += v == inf;
      if (std::isfinite(v)) {
        least = std::min(least, v);
        most = std::max(most, v);
      }
    }
  }
  sums.least = least;
  sums.most = most;
}

// The loop both tracking passes share: over blocks of kTrackBlock losses, first the block's range (over every loss
// but NaN), then term(v, i, a, b, c, d, in_range) adds loss i's four terms (φ's scaled by 1/kTrackBlock) and writes
// its gradient, where in_range (std::true_type or std::false_type) says whether fits(the block's least, most) held;
// each block's sums go to φ's mean and to the three sums named by second, third and fourth, in double, and the
// row's range to finite_range().
template <typename T, typename Fits, typename Term>
[[gnu::always_inline]] inline void blocked_pass(const T* row, int64_t n, TrackSums<T>& sums, double TrackSums<T>::*second,
                                                double TrackSums<T>::*third, double TrackSums<T>::*fourth, Fits fits,
                                                Term term) {
  const T inf = std::numeric_limits<T>::infinity();
  T least = inf, most = -inf;
  for (int64_t start = 0; start < n; start += kTrackBlock) {
    const int64_t end = std::min(n, start + kTrackBlock);
    T block_least = inf, block_most = -inf;
#pragma omp simd reduction(min : block_least) reduction(max : block_most)
    for (int64_t i = start; i < end; ++i) {
      const T v = row[i];  // selects, not std::min: GCC left std::min's loop scalar here
      block_least = v < block_least ? v : block_least;
      block_most = v > block_most ? v : block_most;
    }
    least = std::min(least, block_least);
    most = std::max(most, block_most);
    T a = 0, b = 0, c = 0, d = 0;
    auto sum_terms = [&](auto in_range) {
#pragma omp simd reduction(+ : a, b, c, d)
      for (int64_t i = start; i < end; ++i) term(row[i], i, a, b, c, d, in_range);
    };
    if (fits(block_least, block_most)) sum_terms(std::true_type{});
    else sum_terms(std::false_type{});
    sums.phi += double(a) * (double(kTrackBlock) / double(n));  // the mean of φ: no double sum overflows
    sums.*second += double(b);
    sums.*third += double(c);
    sums.*fourth += double(d);
  }
  finite_range(row, n, least, most, sums);
}

// SReLU's φ (as term(): ½x + ½√(x²+δ²), the mean finished outside), φ' times step into grad, and the solve's
// three sums (φ', φ'', d/dλ φ'') from one square root and one division per loss (the count's φ' in its
// accurate form δ²/(2r(r − z)) below λ, the gradient's ½(1 + z/r) as the torch path's eager kernel has it).
// A block whose every x = v − λ lies within ±big skips term()'s clamps (the same values there). Factors of
// ½ and 3 are taken out of the terms and put on the sums (twice φ where in range, twice φ', a third of the
// change): the same bits but for the change's rounding. Both together: the pass in about 0.63 of its time.
template <typename T, bool kGrads>
TOPKLAB_CLONES void track_pass(const T* row, int64_t n, T lam, T dd, T step, T* grad, TrackSums<T>& sums) {
  constexpr T big = beyond_square<T>();
  constexpr T half_shrink = T(0.5) / T(kTrackBlock);
  const T half_dd = T(0.5) * dd, half_step = T(0.5) * step;
  using S = TrackSums<T>;
  const auto fits = [&](T least, T most) { return most - lam <= big && least - lam >= -big; };
  blocked_pass(row, n, sums, &S::count, &S::curvature, &S::change, fits, [&](T v, int64_t i, T& phi_sum, T& count,
                                                                              T& curvature, T& change, auto in_range) {
    const T x = v - lam;
    T low = x, z = x;
    if constexpr (!decltype(in_range)::value) {
      low = x < -big ? -big : x;
      z = low > big ? big : low;
    }
    const T root = std::sqrt(z * z + dd);
    const T size = std::abs(low);
    const T span = root - (z < T(0) ? z : T(0));
    const T reciprocal = T(1) / (root * span);  // root·span in [δ², 2^127] in float (|z| <= 2^63, δ >= 1e-15)
    const T inverse = span * reciprocal;
    const T twice_slope = T(1) + z * inverse;
    const T bend = half_dd * (inverse * inverse * inverse);
    const T top = root < size ? size : root;
    if constexpr (decltype(in_range)::value) phi_sum += (low + top) * half_shrink;
    else phi_sum += (T(0.5) * low + T(0.5) * top) * (T(2) * half_shrink);  // low + top may overflow out of range
    count += z < T(0) ? dd * reciprocal : twice_slope;  // below λ δ²/(r(r − z)), where 1 + z/r cancels
    curvature += bend;
    change += bend * (z * (inverse * inverse));
    if constexpr (kGrads) grad[i] = twice_slope * half_step;
  });
  sums.count *= 0.5;
  sums.change *= 3.0;
}

// MATk's pass at λ with the window w: ReLU's φ and φ' (as term()), the count above λ and the counts within w
// of λ on either side, from which relu_track_step() takes the next λ.
template <typename T, bool kGrads>
TOPKLAB_CLONES void relu_track_pass(const T* row, int64_t n, T lam, T width, T step, T* grad, TrackSums<T>& sums) {
  constexpr T shrink = T(1) / T(kTrackBlock);
  T zero = T(0);
  __asm__("" : "+m"(zero));  // as in rows(): with the literal, GCC turned ReLU's select into a branch
  using S = TrackSums<T>;
  const auto always = [](T, T) { return true; };  // ReLU's term has no clamps: one loop
  blocked_pass(row, n, sums, &S::count, &S::near_above, &S::near_below, always, [&](T v, int64_t i, T& phi_sum,
                                                                                     T& count, T& near_above,
                                                                                     T& near_below, auto) {
    const T x = v - lam;
    const T phi = x <= T(0) ? zero : x;  // NaN stays NaN, as in torch's relu
    const T up = x > T(0) ? T(1) : zero;
    phi_sum += phi * shrink;
    count += up;
    near_above += x > T(0) && x <= width ? T(1) : zero;
    near_below += x <= T(0) && x > -width ? T(1) : zero;
    if constexpr (kGrads) grad[i] = up * step;
  });
}

// The window holds about this many losses on the side λ moves to (at least kWindowLosses, else 1/kWindowShare
// of the row): solve.py's WINDOW_LOSSES and WINDOW_SHARE (change one, change both).
constexpr double kWindowLosses = 4.0, kWindowShare = 32.0;

// MATk's next λ and window from the counts at λ (solve.py's relu_threshold_step): where e = #{ℓ > λ} − k losses
// too many (too few) lie above λ and the window above (below) holds at least |e|, λ moves |e|/m of the way
// across it (m its count: the |e|-th loss there, were they evenly spaced) and the window is scaled towards
// holding the target count (×½ to ×2); otherwise λ moves the whole window and the window doubles. λ stays within
// the finite losses' range, and the window at least their mean spacing.
template <typename T>
void relu_track_step(const TrackSums<T>& sums, T lam, T width, T k, int64_t n, T& next, T& next_width) {
  T least = sums.least, most = sums.most;
  if (least > most) least = most = T(0);  // no finite loss
  const T excess = T(sums.count) - k;
  const T target = T(std::max(kWindowLosses, double(n) / kWindowShare));
  T moved = lam, window = width;
  if (excess != T(0)) {
    const T near = T(excess > T(0) ? sums.near_above : sums.near_below), need = std::abs(excess);
    const T sign = excess > T(0) ? T(1) : T(-1);
    if (near >= need) {
      moved = lam + sign * width * (need / near);
      window = width * std::min(T(2), std::max(T(0.5), target / near));
    } else {
      moved = lam + sign * width;
      window = T(2) * width;
    }
  }
  next = std::min(std::max(moved, least), most);
  next_width = std::max(window, (most - least) / T(n));
}

// The next λ from the sums at λ: one step of solve_rows() (its bracket of this row, moved to λ on λ's side,
// and its power-law step, bisecting where the step leaves the bracket); λ itself where the count is k.
template <typename T>
T track_step(const TrackSums<T>& sums, T lam, T k, T d, int64_t n) {
  T least = sums.least, most = sums.most;
  if (least > most) least = most = T(0);  // no finite loss
  const T nn = T(n), above = T(sums.infs);
  const T lower_gap = nn - k < T(0.5) ? T(0.5) : nn - k, upper_gap = k - above < T(0.5) ? T(0.5) : k - above;
  T low = least - d * std::sqrt(nn / lower_gap), high = most + d * std::sqrt(nn / upper_gap);
  const T count = T(sums.count), excess = count - k;
  if (excess == T(0)) return lam;
  if (excess > T(0)) low = std::max(low, lam); else high = std::min(high, lam);
  const T proposal = lam + power_law_step(count, excess, k, nn, T(sums.curvature), T(sums.change));
  // a step below half λ's resolution rounds back to λ: the root to λ's precision (solve.py's rule), where
  // bisecting threw the root away on every fifth call of an unchanging batch in float32; not where δ is
  // below that resolution (losses tied at λ make the count jump within one step of λ: bisect)
  const T size = std::abs(lam);
  if (proposal == lam && d >= std::nextafter(size, std::numeric_limits<T>::infinity()) - size) return lam;
  return proposal > low && proposal < high ? proposal : T(0.5) * (low + high);
}

// One tracked training call on losses (n,): the value at λ = lam_last (float32 buffer: the
// step of the previous call), differentiable in the losses; lam_last set to the next step (MATk's: from the
// counts in its window lam_width, which it updates) and the running average lam_avg moved towards it (both left as they are on a row with a NaN loss or a non-finite step); the
// call recorded in the monitor's state with its smoothed share Σφ'/n at the λ it used.
struct RowTracked : public torch::autograd::Function<RowTracked> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& losses_in, at::Tensor lam_avg,
                            at::Tensor lam_last, const std::optional<at::Tensor>& lam_width, at::Tensor state,
                            int64_t smoothing, double k, double delta, double scale, double momentum, double burn_in,
                            bool sample) {
    TORCH_CHECK(lam_avg.scalar_type() == at::kFloat && lam_last.scalar_type() == at::kFloat, "λ buffers must be float32");
    TORCH_CHECK(smoothing == kSReLU || (smoothing == kReLU && lam_width.has_value() &&
                                        lam_width->scalar_type() == at::kFloat),
                "a tracked row_call tracks SReLU's λ, or ReLU's with a float32 window");
    const bool grads = ctx != nullptr;
    const at::Tensor losses = losses_in.contiguous();
    const int64_t n = losses.size(0);
    at::Tensor value = at::empty({}, losses.options());
    at::Tensor grad = grads ? at::empty_like(losses) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES(losses.scalar_type(), "row_tracked_cpu", [&] {
      const scalar_t* row = losses.data_ptr<scalar_t>();
      const scalar_t lam = scalar_t(lam_last.data_ptr<float>()[0]), d = scalar_t(delta), kk = scalar_t(k),
                     s = scalar_t(scale), step = s / scalar_t(n);
      TrackSums<scalar_t> sums;
      scalar_t* grad_out = grads ? grad.data_ptr<scalar_t>() : nullptr;
      const bool relu = smoothing == kReLU;
      const scalar_t width = relu ? scalar_t(lam_width->data_ptr<float>()[0]) : scalar_t(0);
      if (relu && grads) relu_track_pass<scalar_t, true>(row, n, lam, width, step, grad_out, sums);
      else if (relu) relu_track_pass<scalar_t, false>(row, n, lam, width, step, nullptr, sums);
      else if (grads) track_pass<scalar_t, true>(row, n, lam, d * d, step, grad_out, sums);
      else track_pass<scalar_t, false>(row, n, lam, d * d, step, nullptr, sums);
      const scalar_t hinge = relu ? scalar_t(sums.phi) : scalar_t(sums.phi) - scalar_t(0.5) * d;
      value.data_ptr<scalar_t>()[0] = (hinge + kk / scalar_t(n) * lam) * s;
      const bool undefined = std::isnan(sums.phi);  // a NaN loss: no step, λ stays
      scalar_t next = lam, next_width = width;
      if (!undefined && relu) relu_track_step(sums, lam, width, kk, n, next, next_width);
      else if (!undefined) next = track_step(sums, lam, kk, d, n);
      if (!undefined && std::isfinite(next)) {
        if (relu && std::isfinite(float(next_width))) lam_width->data_ptr<float>()[0] = float(next_width);
        float* avg = lam_avg.data_ptr<float>();
        lam_last.data_ptr<float>()[0] = float(next);
        avg[0] = float(1.0 - momentum) * avg[0] + float(momentum) * float(next);
      }
      const scalar_t share = undefined ? std::numeric_limits<scalar_t>::quiet_NaN() : scalar_t(sums.count / double(n));
      record_call<scalar_t>(state.data_ptr<double>(), share, k, double(n), burn_in);
      if (sample) sample_call<scalar_t>(state.data_ptr<double>(), row, n, lam, int64_t(k));
    });
    if (grads) ctx->save_for_backward({grad});
    return value;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_value) {
    return saved_gradient_times(ctx, grad_value[0]);
  }
};

// How one call on a row of losses runs (thresholded.py's _row_plan builds one per row length and settings):
// at a given λ (kAtLambda: the trained parameter, or the running average outside training), or a training call
// of a λ rule that sets λ itself (kTracked: RowTracked; kSolved: RowSolved).
enum Entry : int64_t { kAtLambda = 0, kTracked = 1, kSolved = 2 };

struct RowCall {
  int64_t entry = kAtLambda;
  int64_t smoothing = kSReLU;
  double k = 1.0, delta = 0.0, scale = 1.0, momentum = 0.1;  // k's count, δ, the output scale, the average's weight
  int64_t steps = 1;                                           // kSolved: SReLU's solve steps
};

// One call on losses (n,): lam the 0-d λ (kAtLambda) or the float32 running average (the other entries, with
// lam_last and MATk's lam_width); state the λ monitor's sums where the call is recorded (a training call);
// burn_in the monitor's; grads: differentiable in the losses (and in λ at kAtLambda); sample: the monitor's sample.
at::Tensor row_call(const at::Tensor& losses, const at::Tensor& lam, const std::optional<at::Tensor>& lam_last,
                    const std::optional<at::Tensor>& lam_width, const std::optional<at::Tensor>& state,
                    const RowCall& call, double burn_in, bool grads, bool sample) {
  if (call.entry != kAtLambda) {
    TORCH_CHECK(lam_last.has_value() && state.has_value(), "a training call that sets λ needs lam_last and the state");
    if (call.entry == kTracked)
      return grads ? RowTracked::apply(losses, lam, *lam_last, lam_width, *state, call.smoothing, call.k, call.delta,
                                       call.scale, call.momentum, burn_in, sample)
                   : RowTracked::forward(nullptr, losses, lam, *lam_last, lam_width, *state, call.smoothing, call.k,
                                         call.delta, call.scale, call.momentum, burn_in, sample);
    TORCH_CHECK(call.entry == kSolved, "unknown entry ", call.entry);
    return grads ? RowSolved::apply(losses, lam, *lam_last, *state, call.k, call.delta, call.scale, call.smoothing,
                                    call.momentum, call.steps, burn_in, sample)
                 : RowSolved::forward(nullptr, losses, lam, *lam_last, *state, call.k, call.delta, call.scale,
                                      call.smoothing, call.momentum, call.steps, burn_in, sample);
  }
  return grads ? RowThresholded::apply(losses, lam, call.delta, call.k, call.scale, call.smoothing, state, burn_in,
                                       sample)
               : RowThresholded::forward(nullptr, losses, lam, call.delta, call.k, call.scale, call.smoothing, state,
                                         burn_in, sample);
}

// (Σ_i z_i/r_i, Σ_i r_i⁻³) over 1-D values with z = v − λ, r = √(z² + δ²), elementwise in the values'
// dtype and summed in double: one Newton step of the STk gradient selector (sparsification/selectors.py).
template <typename T>
TOPKLAB_CLONES void ratio_sums(const T* v, int64_t n, double lam, double delta, double& ratio, double& cubes) {
  const T lm = T(lam), dd = T(delta * delta);
  double r = 0.0, c = 0.0;
#pragma omp simd reduction(+ : r, c)
  for (int64_t i = 0; i < n; ++i) {
    const T z = v[i] - lm;
    const T root = std::sqrt(z * z + dd);
    r += double(z / root);
    c += double(T(1) / (root * root * root));
  }
  ratio = r;
  cubes = c;
}

std::vector<double> srelu_ratio_sums(const at::Tensor& values_in, double lam, double delta) {
  TORCH_CHECK(values_in.device().is_cpu() && values_in.dim() == 1, "values must be a 1-D CPU tensor");
  auto values = values_in.detach().contiguous();
  double ratio = 0.0, cubes = 0.0;
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "srelu_ratio_sums_cpu", [&] {
    ratio_sums<scalar_t>(values.data_ptr<scalar_t>(), values.numel(), lam, delta, ratio, cubes);
  });
  return {ratio, cubes};
}

// Average and ATk on one row of CPU losses (n,): the plain torch expression's value (`x.mean()` for k = 0, else
// `x.topk(k).values.mean()`: aten's kernels, the same bits) with its gradient made in the forward,
// which the backward hands over where the incoming gradient is one (else it computes autograd's chain: the mean's
// g / k over the selected losses, scattered); one node instead of aten's two or three. Reverse mode only: where a
// tracer, a forward-mode tangent, a transform or a mode is watching (watched()), the caller runs the expression.
struct RowTopMean : public torch::autograd::Function<RowTopMean> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& losses, int64_t k,
                            bool& overflowed) {
    const int64_t n = losses.size(0);
    const bool all = k == 0;
    k = all ? n : k;
    at::Tensor value, indices;
    if (all) {
      value = at::sum(losses);
    } else {
      auto top = at::topk(losses, k);
      value = at::sum(std::get<0>(top));
      indices = std::get<1>(top);
    }
    AT_DISPATCH_FLOATING_TYPES(losses.scalar_type(), "top_mean", [&] {
      scalar_t& mean = value.data_ptr<scalar_t>()[0];
      mean /= scalar_t(k);  // aten's mean on a CPU: the sum's kernel, then a division by the count
      overflowed = std::isinf(mean);
      if (ctx == nullptr || overflowed) return;
      const scalar_t share = scalar_t(1) / scalar_t(k);  // autograd's g / k at g = 1
      at::Tensor grad = at::empty_like(losses, at::MemoryFormat::Contiguous);
      scalar_t* out = grad.data_ptr<scalar_t>();
      if (all) {
        std::fill(out, out + n, share);
      } else {
        std::fill(out, out + n, scalar_t(0));
        const int64_t* selected = indices.data_ptr<int64_t>();
        for (int64_t i = 0; i < k; ++i) out[selected[i]] = share;
      }
      ctx->save_for_backward({grad, indices});
    });
    return value;
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& losses, int64_t k) {
    bool overflowed = false;
    return forward(ctx, losses, k, overflowed);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_value) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grad_value[0];
    // the saved gradient does not depend on g: under create_graph with a g that requires grad, the chain
    if (all_ones(g) && !(at::GradMode::is_enabled() && g.requires_grad())) return {saved[0], at::Tensor()};
    if (!saved[1].defined()) return {g.expand({saved[0].numel()}) / saved[0].numel(), at::Tensor()};
    return {at::zeros_like(saved[0]).scatter_(0, saved[1], g.expand({saved[1].numel()}) / saved[1].numel()),
            at::Tensor()};
  }
};

// Whether something would see through the node to the aten calls it stands for, and must get them: a tracer
// (torch.jit.trace), a forward-mode tangent, a functorch transform or a tensor subclass, a dispatch or function mode.
bool watched(const at::Tensor& losses) {
  return torch::jit::tracer::isTracing() || at::isTensorSubclassLike(losses) ||
         at::impl::PythonTorchFunctionTLS::stack_len() > 0 || losses._fw_grad(/*level=*/0).defined();
}

// The value of Average (k = 0: the mean of all n) or ATk on losses that are one non-empty row (n,) of float32/float64 CPU
// losses, differentiable in them where they require grad under grad mode; None for other losses, a k above n, a
// value of ±inf (a sum that overflowed: the caller redoes it without overflow), or losses that are watched.
std::optional<at::Tensor> top_mean_row(const at::Tensor& losses, int64_t k) {
  if (losses.dim() != 1 || !losses.is_cpu() || losses.layout() != at::kStrided || losses.size(0) == 0 ||
      (losses.scalar_type() != at::kFloat && losses.scalar_type() != at::kDouble) || k < 0 || k > losses.size(0) ||
      watched(losses))
    return std::nullopt;
  at::Tensor value;
  if (at::GradMode::is_enabled() && losses.requires_grad()) {
    value = RowTopMean::apply(losses, k);
  } else {
    bool overflowed = false;
    value = RowTopMean::forward(nullptr, losses, k, overflowed);
  }
  return one_is_inf(value) ? std::nullopt : std::optional<at::Tensor>(value);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("SOURCE_SHA") = TOPKLAB_SOURCE_SHA;
  m.attr("TORCH_VERSION") = TOPKLAB_TORCH_VERSION;
  m.def("thresholded", &thresholded, "value per row, differentiable in the losses and λ");
  m.def("run", &run, "(value, ∂/∂losses, ∂/∂λ) per row, no autograd");
  m.def("srelu_ratio_sums", &srelu_ratio_sums, "(Σ z/r, Σ r⁻³) with z = v − λ, r = √(z² + δ²), in double");
  pybind11::class_<RowCall>(m, "RowCall", "how one call on a row of losses runs (thresholded.py's _row_plan)")
      .def(pybind11::init<>())
      .def_readwrite("entry", &RowCall::entry)
      .def_readwrite("smoothing", &RowCall::smoothing)
      .def_readwrite("k", &RowCall::k)
      .def_readwrite("delta", &RowCall::delta)
      .def_readwrite("scale", &RowCall::scale)
      .def_readwrite("momentum", &RowCall::momentum)
      .def_readwrite("steps", &RowCall::steps);
  m.attr("AT_LAMBDA") = int64_t(kAtLambda);
  m.attr("TRACKED") = int64_t(kTracked);
  m.attr("SOLVED") = int64_t(kSolved);
  m.def("row_call", &row_call, "one call on a row of losses (RowCall): the value, differentiable in the losses");
  m.def("top_mean_row", &top_mean_row, "Average (k = 0) or ATk of one CPU row as torch's expression; None: not one");
  m.def("solve_srelu", &solve_srelu, "(λ, smoothed count above λ) per row: the root of Σ SReLU'(ℓ − λ) = k");
}
