// Finite-difference gradient checks (fp64) and small helpers shared by the kernel tests.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "core/tensor.hpp"

namespace hcp::test {

inline Tensor rand(const Shape& s, std::uint64_t seed, double lo = -1, double hi = 1, DType dt = DType::F64) {
  Tensor t = Tensor::empty(s, dt);
  fill_uniform(t, seed, lo, hi);
  return t;
}

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.get(i) * b.get(i);
  return s;
}

// Central differences of loss() w.r.t. every element of `x` (perturbed in place), compared with
// `analytic`: |fd - an| <= atol + rtol |fd|. Step 1e-6 in fp64 gives ~1e-9 truncation+rounding error.
inline void fd_check(Tensor& x, const Tensor& analytic, const std::function<double()>& loss, const std::string& name,
                     double atol = 1e-7, double rtol = 1e-6, double h = 1e-6) {
  ASSERT_EQ(x.numel(), analytic.numel()) << name;
  int bad = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double x0 = x.get(i);
    x.set(i, x0 + h);
    const double lp = loss();
    x.set(i, x0 - h);
    const double lm = loss();
    x.set(i, x0);
    const double fd = (lp - lm) / (2 * h), an = analytic.get(i);
    if (std::abs(fd - an) > atol + rtol * std::abs(fd)) {
      if (++bad <= 5) ADD_FAILURE() << name << "[" << i << "]: finite difference " << fd << ", analytic " << an;
    }
  }
  EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << x.numel() << " elements differ";
}

inline void expect_close(const Tensor& a, const Tensor& ref, double atol, double rtol, const std::string& name) {
  ASSERT_EQ(a.numel(), ref.numel()) << name;
  int bad = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = ref.get(i);
    if (!(std::abs(x - y) <= atol + rtol * std::abs(y))) {
      if (++bad <= 5) ADD_FAILURE() << name << "[" << i << "]: " << x << " vs reference " << y;
    }
  }
  EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << a.numel() << " elements differ";
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace hcp::test
