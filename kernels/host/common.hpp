// Shared helpers of the host (Kokkos) kernels: typed buffers over tensors, dispatch on precision.
#pragma once
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/tensor.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels::host {

using Exec = Kokkos::DefaultHostExecutionSpace;
using Range = Kokkos::RangePolicy<Exec>;
template <class T>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
template <class T>
using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

inline void require_host(const Tensor& t, const char* what) {
  HCP_CHECK(t.defined(), what, ": tensor is not defined");
  HCP_CHECK(t.space() == Space::Host, what, ": a host body was handed a CUDA tensor (this op runs on host tensors)");
  HCP_CHECK(t.is_contiguous(), what, ": tensor must be contiguous, shape ", shape_str(t.shape()));
}
using rules::require_numel;

// Read-only T view of a tensor; converts (bf16/fp32/fp64) into a temporary when the dtype differs.
template <class T>
class In {
 public:
  explicit In(const Tensor& t, const char* what = "input") {
    require_host(t, what);
    if (t.dtype() == dtype_of<T>()) {
      p_ = t.data<T>();
    } else {
      tmp_ = t.to(dtype_of<T>());
      p_ = tmp_.data<T>();
    }
  }
  const T* get() const { return p_; }
  operator const T*() const { return p_; }

 private:
  Tensor tmp_;
  const T* p_ = nullptr;
};

// Writable T view; a temporary is written back on destruction when the dtype differs.
template <class T>
class Out {
 public:
  // `load`: start from the tensor's current values (in-place ops); otherwise from zeros.
  explicit Out(Tensor& t, const char* what = "output", bool load = false) : t_(t) {
    require_host(t, what);
    if (t.dtype() == dtype_of<T>()) {
      p_ = t.data<T>();
    } else {
      tmp_ = load ? t.to(dtype_of<T>()) : Tensor::zeros(t.shape(), dtype_of<T>(), Space::Host);
      p_ = tmp_.data<T>();
    }
  }
  ~Out() {
    if (tmp_.defined()) t_.copy_from(tmp_);
  }
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;
  T* get() const { return p_; }
  operator T*() const { return p_; }

 private:
  Tensor& t_;
  Tensor tmp_;
  T* p_ = nullptr;
};

// exp(x[i]) for i < n, in place: libm's exp for double; for float a vectorised form
// (kernels/host/vmath.cpp) within 2 ulp of expf on [-87, 88], about 1.6e-38 below -87 (the softmax
// sums it with terms >= 1). x must not be NaN and must be <= 88.
inline void exp_inplace(double* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}
void exp_inplace(float* x, std::int64_t n);
// max(init, x[0..n)) (NaN-free input) and sum of x[0..n), in eight lanes combined in a fixed order.
float row_max(const float* x, std::int64_t n, float init);
double row_max(const double* x, std::int64_t n, double init);
float row_sum(const float* x, std::int64_t n);
double row_sum(const double* x, std::int64_t n);

template <class T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
template <class T>
inline T softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}
template <class T>
inline T silu(T x) {
  return x * sigmoid(x);
}
template <class T>
inline T dsilu(T x) {
  T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

}  // namespace hcp::kernels::host

// Runs the statement with T = double for fp64 `ref`, T = float otherwise.
#define HCP_DISPATCH_FLOAT(ref, ...)          \
  do {                                        \
    if ((ref).dtype() == ::hcp::DType::F64) { \
      using T = double;                       \
      __VA_ARGS__;                            \
    } else {                                  \
      using T = float;                        \
      __VA_ARGS__;                            \
    }                                         \
  } while (0)
