// RMSNorm and gated group RMSNorm on the host (CUDA twin: kernels/cuda/norms.cu).
#include <optional>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/host/host_kernels.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels {
namespace {
using host::In;
using host::Out;
using host::Range;
}  // namespace

// ---- RMSNorm ----------------------------------------------------------------------------------
void host::rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  const std::int64_t C = w.numel();
  const std::int64_t M = x.numel() / C;
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x"), w_(w, "w");
    Out<T> y_(y, "y"), r_(rstd, "rstd");
    const T* xb = x_.get();
    const T* wb = w_.get();
    T* yb = y_.get();
    T* rb = r_.get();
    Kokkos::parallel_for("rmsnorm_fwd", Range(0, M), [&](std::int64_t m) {
      T ss = 0;
      for (std::int64_t c = 0; c < C; ++c) ss += xb[m * C + c] * xb[m * C + c];
      const T r = T(1) / std::sqrt(ss / static_cast<T>(C) + static_cast<T>(eps));
      rb[m] = r;
      for (std::int64_t c = 0; c < C; ++c) yb[m * C + c] = xb[m * C + c] * r * wb[c];
    });
  });
}

void host::rmsnorm_bwd(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy) {
  const std::int64_t C = w.numel();
  const std::int64_t M = x.numel() / C;
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x"), w_(w, "w"), r_(rstd, "rstd"), dy_(dy, "dy");
    Out<T> dx_(dx, "dx"), dw_(dw, "dw");
    const T* xb = x_.get();
    const T* wb = w_.get();
    const T* rb = r_.get();
    const T* dyb = dy_.get();
    T* dxb = dx_.get();
    T* dwb = dw_.get();
    Kokkos::parallel_for("rmsnorm_bwd_dx", Range(0, M), [&](std::int64_t m) {
      const T r = rb[m];
      T dot = 0;
      for (std::int64_t c = 0; c < C; ++c) dot += dyb[m * C + c] * wb[c] * xb[m * C + c];
      const T k = r * r * r * dot / static_cast<T>(C);
      for (std::int64_t c = 0; c < C; ++c) dxb[m * C + c] = r * dyb[m * C + c] * wb[c] - xb[m * C + c] * k;
    });
    Kokkos::parallel_for("rmsnorm_bwd_dw", Range(0, C), [&](std::int64_t c) {
      T acc = 0;
      for (std::int64_t m = 0; m < M; ++m) acc += dyb[m * C + c] * xb[m * C + c] * rb[m];
      dwb[c] = acc;
    });
  });
}

// ---- gated group RMSNorm ----------------------------------------------------------------------
void host::gated_rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w,
                             std::int64_t groups, double eps) {
  const std::int64_t C = w.numel();
  const std::int64_t M = x.numel() / C, Cg = C / groups;
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x"), z_(z, "z"), w_(w, "w");
    Out<T> y_(y, "y"), r_(rstd, "rstd");
    const T* xb = x_.get();
    const T* zb = z_.get();
    const T* wb = w_.get();
    T* yb = y_.get();
    T* rb = r_.get();
    Kokkos::parallel_for("gated_rmsnorm_fwd", Range(0, M * groups), [&](std::int64_t mg) {
      const std::int64_t base = (mg / groups) * C + (mg % groups) * Cg, c0 = (mg % groups) * Cg;
      T ss = 0;
      for (std::int64_t c = 0; c < Cg; ++c) {
        const T gv = xb[base + c] * host::silu(zb[base + c]);
        ss += gv * gv;
      }
      const T r = T(1) / std::sqrt(ss / static_cast<T>(Cg) + static_cast<T>(eps));
      rb[mg] = r;
      for (std::int64_t c = 0; c < Cg; ++c) yb[base + c] = xb[base + c] * host::silu(zb[base + c]) * r * wb[c0 + c];
    });
  });
}

void host::gated_rmsnorm_bwd(Tensor& dx, Tensor& dz, Tensor& dw, const Tensor& x, const Tensor& z, const Tensor& w,
                             const Tensor& rstd, std::int64_t groups, const Tensor& dy) {
  const std::int64_t C = w.numel();
  const std::int64_t M = x.numel() / C, Cg = C / groups;
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x"), z_(z, "z"), w_(w, "w"), r_(rstd, "rstd"), dy_(dy, "dy");
    Out<T> dx_(dx, "dx"), dz_(dz, "dz"), dw_(dw, "dw");
    const T* xb = x_.get();
    const T* zb = z_.get();
    const T* wb = w_.get();
    const T* rb = r_.get();
    const T* dyb = dy_.get();
    T* dxb = dx_.get();
    T* dzb = dz_.get();
    T* dwb = dw_.get();
    Kokkos::parallel_for("gated_rmsnorm_bwd", Range(0, M * groups), [&](std::int64_t mg) {
      const std::int64_t base = (mg / groups) * C + (mg % groups) * Cg, c0 = (mg % groups) * Cg;
      const T r = rb[mg];
      T dot = 0;
      for (std::int64_t c = 0; c < Cg; ++c) dot += dyb[base + c] * wb[c0 + c] * xb[base + c] * host::silu(zb[base + c]);
      const T k = r * r * r * dot / static_cast<T>(Cg);
      for (std::int64_t c = 0; c < Cg; ++c) {
        const T sz = host::silu(zb[base + c]), gv = xb[base + c] * sz;
        const T dg = r * dyb[base + c] * wb[c0 + c] - gv * k;
        dxb[base + c] = dg * sz;
        dzb[base + c] = dg * xb[base + c] * host::dsilu(zb[base + c]);
      }
    });
    Kokkos::parallel_for("gated_rmsnorm_bwd_dw", Range(0, C), [&](std::int64_t c) {
      const std::int64_t g = c / Cg;
      T acc = 0;
      for (std::int64_t m = 0; m < M; ++m)
        acc += dyb[m * C + c] * xb[m * C + c] * host::silu(zb[m * C + c]) * rb[m * groups + g];
      dwb[c] = acc;
    });
  });
}

}  // namespace hcp::kernels
