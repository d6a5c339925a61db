// RMSNorm and gated group RMSNorm on the host (CUDA twin: kernels/cuda/norms.cu).
#include <optional>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels {
namespace {
using host::In;
using host::Out;
using host::Range;
}  // namespace

// ---- RMSNorm ----------------------------------------------------------------------------------
void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  const std::int64_t C = w.numel();
  HCP_CHECK(C > 0 && x.numel() % C == 0, "rmsnorm: x ", shape_str(x.shape()), " is not [M, C=", C, "]");
  const std::int64_t M = x.numel() / C;
  host::require_numel(y, x.numel(), "rmsnorm_fwd: y");
  host::require_numel(rstd, M, "rmsnorm_fwd: rstd");
  HCP_ROUTE_CUDA(x, cuda_impl::rmsnorm_fwd(y, rstd, x, w, eps));
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

void rmsnorm_bwd(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy) {
  const std::int64_t C = w.numel();
  HCP_CHECK(C > 0 && x.numel() % C == 0, "rmsnorm: x ", shape_str(x.shape()), " is not [M, C=", C, "]");
  const std::int64_t M = x.numel() / C;
  host::require_numel(dx, x.numel(), "rmsnorm_bwd: dx");
  host::require_numel(dw, C, "rmsnorm_bwd: dw");
  host::require_numel(rstd, M, "rmsnorm_bwd: rstd");
  host::require_numel(dy, x.numel(), "rmsnorm_bwd: dy");
  HCP_ROUTE_CUDA(x, cuda_impl::rmsnorm_bwd(dx, dw, x, w, rstd, dy));
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
void gated_rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w, std::int64_t groups,
                       double eps) {
  const std::int64_t C = w.numel();
  HCP_CHECK(groups > 0 && C % groups == 0, "gated_rmsnorm: groups (", groups, ") must divide channels (", C, ")");
  HCP_CHECK(C > 0 && x.numel() % C == 0 && z.numel() == x.numel(), "gated_rmsnorm: x ", shape_str(x.shape()), " / z ",
            shape_str(z.shape()), " are not [M, C=", C, "]");
  const std::int64_t M = x.numel() / C, Cg = C / groups;
  host::require_numel(y, x.numel(), "gated_rmsnorm_fwd: y");
  host::require_numel(rstd, M * groups, "gated_rmsnorm_fwd: rstd [M,G]");
  HCP_ROUTE_CUDA(x, cuda_impl::gated_rmsnorm_fwd(y, rstd, x, z, w, groups, eps));
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

void gated_rmsnorm_bwd(Tensor& dx, Tensor& dz, Tensor& dw, const Tensor& x, const Tensor& z, const Tensor& w,
                       const Tensor& rstd, std::int64_t groups, const Tensor& dy) {
  const std::int64_t C = w.numel();
  HCP_CHECK(groups > 0 && C % groups == 0, "gated_rmsnorm: groups (", groups, ") must divide channels (", C, ")");
  HCP_CHECK(C > 0 && x.numel() % C == 0 && z.numel() == x.numel(), "gated_rmsnorm: x / z are not [M, C]");
  const std::int64_t M = x.numel() / C, Cg = C / groups;
  host::require_numel(dx, x.numel(), "gated_rmsnorm_bwd: dx");
  host::require_numel(dz, x.numel(), "gated_rmsnorm_bwd: dz");
  host::require_numel(dw, C, "gated_rmsnorm_bwd: dw");
  host::require_numel(rstd, M * groups, "gated_rmsnorm_bwd: rstd");
  host::require_numel(dy, x.numel(), "gated_rmsnorm_bwd: dy");
  HCP_ROUTE_CUDA(x, cuda_impl::gated_rmsnorm_bwd(dx, dz, dw, x, z, w, rstd, groups, dy));
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
