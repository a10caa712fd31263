// Pool adjacent violators of SparseTopK on the CPU, every row of a batch in one call (rows in
// parallel). The same pushes, merges and floating-point operations, in the same order, as the
// Python reference in topklab/operators/sparse_topk.py (_pav_l2_row, _pav_l4_row,
// _cubic_block_value), in double and built with -ffp-contract=off (no fused multiply-add), so both
// give the same bits. ``isotonic`` is the solver alone; ``sparse_mask`` is the whole sorted mask
// (the squeeze of _compress, PAV, the mask of _SortedMask) with its backward in C++, elementwise as
// that module's torch operations round (the squeeze's log1p is the C library's, which may differ
// from torch's in the last bit; only items beyond ±CUT see it, and they pool only with their ties).
// Prebuilt with the package (setup.py), else built on first use (topklab.utils.native.load_native).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>

#ifndef TOPKLAB_SOURCE_SHA
#define TOPKLAB_SOURCE_SHA ""  // a build on first use: the source it was built from is the one beside it
#endif
#ifndef TOPKLAB_TORCH_VERSION
#define TOPKLAB_TORCH_VERSION ""
#endif

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

// Python's float ** float for a finite base: pow of |x|, negated for a negative base (odd exponent).
inline double py_pow(double x, double y) { return x < 0.0 ? -std::pow(-x, y) : std::pow(x, y); }

// One row's blocks, left to right (a stack: the last one is the one merges go into).
struct L2Block {
  double value, sum;
  int64_t size;
};

// q = 4 also keeps the power sums s_m of t − c about the block's first item's t (c), its weight Σw
// and the range [low, high] of t − c in it.
struct L4Block {
  double value, c, s1, s2, s3, weight, low, high;
  int64_t size;
};

// q = 2: the non-increasing isotonic regression of y = t − w. A block merges with its left
// neighbour while that one is not strictly larger; a merge of equal values keeps the value.
int64_t pav_l2(const double* t, const double* w, int64_t n, L2Block* s) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double y = t[i] - w[i];
    s[m++] = {y, y, 1};
    while (m > 1 && s[m - 2].value <= s[m - 1].value) {
      L2Block& left = s[m - 2];
      const bool tie = left.value == s[m - 1].value;
      left.size += s[m - 1].size;
      left.sum += s[m - 1].sum;
      --m;
      if (!tie) left.value = left.sum / double(left.size);
    }
  }
  return m;
}

// The root u of f(u) = Σ(r_i − u)^3 − weight (decreasing in u) from s_m = Σ r_i^m: Newton's method
// kept inside the bracket [low, high], bisection otherwise (_cubic_block_value).
double cubic_block_value(int64_t count, double s1, double s2, double s3, double weight, double low, double high) {
  const double n = double(count);
  double u = 0.5 * (low + high);
  for (int iteration = 0; iteration < 200; ++iteration) {
    const double value = s3 - 3.0 * u * s2 + 3.0 * u * u * s1 - n * py_pow(u, 3.0) - weight;
    if (value == 0.0) return u;
    if (value > 0.0) {
      low = u;
    } else {
      high = u;
    }
    const double slope = -3.0 * (s2 - 2.0 * u * s1 + n * u * u);
    const double step = slope < 0.0 ? u - value / slope : std::numeric_limits<double>::quiet_NaN();
    const double next = (low < step && step < high) ? step : 0.5 * (low + high);
    if (std::abs(next - u) <= 4e-16 * std::max(1.0, std::abs(u)) || !(low < next && next < high)) {
      return (low <= next && next <= high) ? next : u;
    }
    u = next;
  }
  return u;
}

// q = 4 (p = 4/3): a block's value γ solves Σ_B (t_i − γ)^3 = Σ_B w_i.
int64_t pav_l4(const double* t, const double* w, int64_t n, L4Block* s) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    s[m++] = {t[i] - py_pow(w[i], 1.0 / 3.0), t[i], 0.0, 0.0, 0.0, w[i], 0.0, 0.0, 1};
    while (m > 1 && s[m - 2].value <= s[m - 1].value) {
      L4Block& b = s[m - 2];
      const L4Block& r = s[m - 1];  // merges into b
      const double d = r.c - b.c, n2 = double(r.size);
      b.size += r.size;
      b.s3 = b.s3 + r.s3 + 3.0 * d * r.s2 + 3.0 * d * d * r.s1 + n2 * py_pow(d, 3.0);
      b.s2 = b.s2 + r.s2 + 2.0 * d * r.s1 + n2 * d * d;
      b.s1 = b.s1 + r.s1 + n2 * d;
      b.weight += r.weight;
      b.low = std::min(b.low, r.low + d);
      b.high = std::max(b.high, r.high + d);
      --m;
      // f(max r) <= −weight <= 0; f(min r − (weight/n)^(1/3)) >= 0.
      const double low = b.low - py_pow(b.weight / double(b.size), 1.0 / 3.0);
      b.value = b.c + cubic_block_value(b.size, b.s1, b.s2, b.s3, b.weight, low, b.high);
    }
  }
  return m;
}

// Each item's block value (in T) and block index, from a row's blocks.
template <typename T, typename Block>
void write_row(const Block* blocks, int64_t m, T* values, int64_t* index) {
  for (int64_t block = 0, i = 0; block < m; ++block) {
    const T value = T(blocks[block].value);
    for (int64_t j = 0; j < blocks[block].size; ++j, ++i) {
      values[i] = value;
      index[i] = block;
    }
  }
}

template <typename T>
void solve_rows(const T* t, const double* w, int64_t batch, int64_t n, int64_t q, T* values, int64_t* blocks) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
  at::parallel_for(0, batch, grain, [&](int64_t begin, int64_t end) {
    // scratch, not initialised: a row writes each entry before it reads it
    std::unique_ptr<L2Block[]> l2(q == 2 ? new L2Block[n] : nullptr);
    std::unique_ptr<L4Block[]> l4(q == 4 ? new L4Block[n] : nullptr);
    std::unique_ptr<double[]> converted(std::is_same_v<T, double> ? nullptr : new double[n]);
    for (int64_t b = begin; b < end; ++b) {
      const double* row;
      if constexpr (std::is_same_v<T, double>) {
        row = t + b * n;
      } else {
        for (int64_t i = 0; i < n; ++i) converted[i] = double(t[b * n + i]);
        row = converted.get();
      }
      if (q == 2) {
        write_row(l2.get(), pav_l2(row, w, n, l2.get()), values + b * n, blocks + b * n);
      } else {
        write_row(l4.get(), pav_l4(row, w, n, l4.get()), values + b * n, blocks + b * n);
      }
    }
  });
}

constexpr double kCut = 4.0;  // sparse_topk.CUT

// _compress's value: t on [−CUT, CUT], ±(CUT + log1p(|t| − CUT)) beyond, ±(CUT + 1000) at ±inf.
template <typename T>
inline T squeeze(T t) {
  if (!std::isfinite(t)) return t > T(0) ? T(kCut + 1000.0) : T(-(kCut + 1000.0));
  const T beyond = std::max(std::abs(t), T(kCut)) - T(kCut);
  if (!(beyond > T(0))) return t;
  return t > T(0) ? std::log1p(beyond) + T(kCut) : -(std::log1p(beyond) + T(kCut));
}

// One row of the sorted mask: squeeze, PAV (double) and u, mask, block index per item.
template <typename T, typename Block>
void mask_row(const T* t, int64_t n, int64_t k, int64_t q, Block* stack, double* row, double* w, T* mask, T* u_out,
              int64_t* index) {
  for (int64_t i = 0; i < n; ++i) {
    row[i] = double(squeeze(t[i]));
    w[i] = i < k ? 1.0 : 0.0;
  }
  int64_t m;
  if constexpr (std::is_same_v<Block, L2Block>) {
    m = pav_l2(row, w, n, stack);
  } else {
    m = pav_l4(row, w, n, stack);
  }
  for (int64_t block = 0, i = 0; block < m; ++block) {
    const T value = T(stack[block].value);
    const int64_t size = stack[block].size;
    for (int64_t j = 0; j < size; ++j, ++i) {
      // singletons are exactly w (exact 0s and 1s); pooled items t − γ
      T u = size == 1 ? T(w[i]) : T(row[i]) - value;
      if (q == 2) {
        mask[i] = std::min(std::max(u, T(0)), T(1));
      } else {
        u = std::max(u, T(0));
        mask[i] = std::min(std::max(u * u * u, T(0)), T(1));
        u_out[i] = u;
      }
      index[i] = block;
    }
  }
}

// (mask (batch, n), u (batch, n) for q = 4 else undefined, block index (batch, n)) of sorted t.
std::vector<at::Tensor> mask_forward(const at::Tensor& t, int64_t k, int64_t q) {
  const int64_t batch = t.size(0), n = t.size(1);
  at::Tensor mask = at::empty_like(t);
  at::Tensor u = q == 4 ? at::empty_like(t) : at::Tensor();
  at::Tensor blocks = at::empty({batch, n}, t.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "sparse_mask_cpu", [&] {
    const scalar_t* in = t.data_ptr<scalar_t>();
    scalar_t* out = mask.data_ptr<scalar_t>();
    scalar_t* u_out = q == 4 ? u.data_ptr<scalar_t>() : nullptr;
    int64_t* index = blocks.data_ptr<int64_t>();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
    at::parallel_for(0, batch, grain, [&](int64_t begin, int64_t end) {
      std::unique_ptr<L2Block[]> l2(q == 2 ? new L2Block[n] : nullptr);
      std::unique_ptr<L4Block[]> l4(q == 4 ? new L4Block[n] : nullptr);
      std::unique_ptr<double[]> row(new double[n]), w(new double[n]);
      for (int64_t b = begin; b < end; ++b) {
        const int64_t o = b * n;
        if (q == 2) {
          mask_row<scalar_t>(in + o, n, k, q, l2.get(), row.get(), w.get(), out + o, nullptr, index + o);
        } else {
          mask_row<scalar_t>(in + o, n, k, q, l4.get(), row.get(), w.get(), out + o, u_out + o, index + o);
        }
      }
    });
  });
  return {mask, u, blocks};
}

// ∂L/∂t of the sorted mask, as _SortedMask.backward and _compress round it: per pooled block B,
// ``m'_j g_j − ω_j·Σ_B m'_i g_i / Σ_B ω`` (block sums accumulated in order, in the dtype), 0 on
// singletons and where t is not finite.
at::Tensor mask_backward(const at::Tensor& grad_in, const at::Tensor& t, const at::Tensor& u, const at::Tensor& blocks,
                         int64_t q) {
  const at::Tensor grad = grad_in.contiguous();
  const int64_t batch = t.size(0), n = t.size(1);
  at::Tensor out = at::empty_like(t);
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "sparse_mask_backward_cpu", [&] {
    using T = scalar_t;
    const T *g = grad.data_ptr<T>(), *in = t.data_ptr<T>(), *uu = q == 4 ? u.data_ptr<T>() : nullptr;
    const int64_t* index = blocks.data_ptr<int64_t>();
    T* result = out.data_ptr<T>();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
    at::parallel_for(0, batch, grain, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t o = b * n;
        for (int64_t a = 0; a < n;) {
          int64_t e = a + 1;
          while (e < n && index[o + e] == index[o + a]) ++e;
          if (e - a == 1) {
            result[o + a] = T(0);
          } else {
            T total_weight = T(0), total_scaled = T(0);
            for (int64_t i = o + a; i < o + e; ++i) {
              total_weight += q == 2 ? T(1) : uu[i] * uu[i];
              total_scaled += q == 2 ? g[i] : T(3) * uu[i] * uu[i] * g[i];
            }
            const T tiny = std::numeric_limits<T>::min();
            for (int64_t i = o + a; i < o + e; ++i) {
              const T weight = q == 2 ? T(1) : uu[i] * uu[i];
              const T scaled = q == 2 ? g[i] : T(3) * uu[i] * uu[i] * g[i];
              const T share = total_weight > T(0) ? weight / std::max(total_weight, tiny) : T(1) / T(e - a);
              result[i] = std::isfinite(in[i]) ? scaled - share * total_scaled : T(0);
            }
          }
          a = e;
        }
      }
    });
  });
  return out;
}

struct SparseMask : public torch::autograd::Function<SparseMask> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& t_in, int64_t k, int64_t q) {
    const at::Tensor t = t_in.detach().contiguous();
    auto out = mask_forward(t, k, q);
    ctx->save_for_backward({t, out[1], out[2]});
    ctx->saved_data["q"] = q;
    return out[0];
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_mask) {
    auto saved = ctx->get_saved_variables();
    return {mask_backward(grad_mask[0], saved[0], saved[1], saved[2], ctx->saved_data["q"].toInt()), at::Tensor(),
            at::Tensor()};
  }
};

// The sorted mask of SparseTopK from t = (sorted scores − the k-th)/ℓ (batch, n), float or double,
// differentiable in t: squeeze, PAV (q = 2 or 4), mask, and the backward of all three in C++.
at::Tensor sparse_mask(const at::Tensor& t, int64_t k, int64_t q) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2, "t must be a (batch, n) CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, "t must be float32 or float64");
  TORCH_CHECK(q == 2 || q == 4, "q must be 2 or 4");
  TORCH_CHECK(k >= 1 && k <= t.size(1), "k must be in [1, n]");
  return SparseMask::apply(t, k, q);
}

// (v, block index per item) of every row of t (batch, n), for the weights w (n,) and q in {2, 4}: the
// solver alone (isotonic_pav(kernel="native"), and SparseTopK on dtypes other than float32/float64).
std::vector<at::Tensor> isotonic(const at::Tensor& t_in, const at::Tensor& w_in, int64_t q) {
  TORCH_CHECK(t_in.device().is_cpu() && t_in.dim() == 2, "t must be a (batch, n) CPU tensor");
  TORCH_CHECK(w_in.dim() == 1 && w_in.size(0) == t_in.size(1), "w must have one entry per column of t");
  TORCH_CHECK(q == 2 || q == 4, "q must be 2 or 4");
  const bool native_type = t_in.scalar_type() == at::kFloat || t_in.scalar_type() == at::kDouble;
  const at::Tensor t = (native_type ? t_in : t_in.to(at::kDouble)).detach().contiguous();
  const at::Tensor w = w_in.detach().to(at::kCPU, at::kDouble).contiguous();
  const int64_t batch = t.size(0), n = t.size(1);
  at::Tensor values = at::empty_like(t);
  at::Tensor blocks = at::empty({batch, n}, t.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "isotonic_pav_cpu", [&] {
    solve_rows<scalar_t>(t.data_ptr<scalar_t>(), w.data_ptr<double>(), batch, n, q, values.data_ptr<scalar_t>(),
                         blocks.data_ptr<int64_t>());
  });
  return {native_type ? values : values.to(t_in.scalar_type()), blocks};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("SOURCE_SHA") = TOPKLAB_SOURCE_SHA;
  m.attr("TORCH_VERSION") = TOPKLAB_TORCH_VERSION;
  m.def("isotonic", &isotonic, "(v, blocks) of every row by pool adjacent violators, q = 2 or 4",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("sparse_mask", &sparse_mask, "SparseTopK's sorted mask of t, differentiable (q = 2 or 4)");
}
