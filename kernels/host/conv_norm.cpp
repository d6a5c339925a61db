// Causal depthwise conv1d (+SiLU, seq_idx aware), RMSNorm and gated group RMSNorm on the host.
#include <optional>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels {
namespace {

using host::In;
using host::Out;
using host::Range;

struct ConvShape {
  std::int64_t B, L, C, W;
};

ConvShape check_conv(const Tensor& x, const Tensor& w, const Tensor* bias, const std::vector<std::int64_t>* seq) {
  HCP_CHECK(x.dim() == 3, "conv1d: x must be [B,L,C], got ", shape_str(x.shape()));
  HCP_CHECK(w.dim() == 2 && w.size(0) == x.size(2), "conv1d: weight must be [C=", x.size(2), ", W], got ",
            shape_str(w.shape()));
  if (bias) host::require_numel(*bias, x.size(2), "conv1d: bias [C]");
  if (seq)
    HCP_CHECK(static_cast<std::int64_t>(seq->size()) == x.size(0) * x.size(1), "conv1d: seq_idx has ", seq->size(),
              " entries, expected B*L = ", x.size(0) * x.size(1));
  return {x.size(0), x.size(1), x.size(2), w.size(1)};
}

// Pre-activation u[b,t,c] for one channel.
template <class T>
T conv_u(const T* x, const T* w, const T* bias, const std::vector<std::int64_t>* seq, const ConvShape& s,
         std::int64_t b, std::int64_t t, std::int64_t c) {
  T u = bias ? bias[c] : T(0);
  const std::int64_t st = seq ? (*seq)[b * s.L + t] : 0;
  for (std::int64_t k = 0; k < s.W; ++k) {
    const std::int64_t src = t - (s.W - 1) + k;
    if (src < 0) continue;
    if (seq && (*seq)[b * s.L + src] != st) continue;
    u += w[c * s.W + k] * x[(b * s.L + src) * s.C + c];
  }
  return u;
}

template <class T> const T* opt_ptr(const std::optional<In<T>>& v) { return v ? v->get() : nullptr; }

}  // namespace

void conv1d_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu) {
  const ConvShape s = check_conv(x, w, bias, seq_idx);
  host::require_numel(y, x.numel(), "conv1d_fwd: y");
  HCP_ROUTE_CUDA(x, cuda_impl::conv1d_fwd(y, x, w, bias, seq_idx, silu));
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x"), w_(w, "w");
    std::optional<In<T>> b_;
    if (bias) b_.emplace(*bias, "bias");
    Out<T> y_(y, "y");
    const T* xb = x_.get();
    const T* wb = w_.get();
    const T* bb = opt_ptr(b_);
    T* yb = y_.get();
    Kokkos::parallel_for("conv1d_fwd", Range(0, s.B * s.L * s.C), [&](std::int64_t i) {
      const std::int64_t c = i % s.C, t = (i / s.C) % s.L, b = i / (s.C * s.L);
      const T u = conv_u(xb, wb, bb, seq_idx, s, b, t, c);
      yb[i] = silu ? host::silu(u) : u;
    });
  });
}

void conv1d_bwd(Tensor& dx, Tensor& dw, Tensor* dbias, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu, const Tensor& dy) {
  const ConvShape s = check_conv(x, w, bias, seq_idx);
  host::require_numel(dx, x.numel(), "conv1d_bwd: dx");
  host::require_numel(dw, w.numel(), "conv1d_bwd: dw");
  host::require_numel(dy, x.numel(), "conv1d_bwd: dy");
  if (dbias) host::require_numel(*dbias, s.C, "conv1d_bwd: dbias");
  HCP_ROUTE_CUDA(x, cuda_impl::conv1d_bwd(dx, dw, dbias, x, w, bias, seq_idx, silu, dy));
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x"), w_(w, "w"), dy_(dy, "dy");
    std::optional<In<T>> b_;
    if (bias) b_.emplace(*bias, "bias");
    Out<T> dx_(dx, "dx"), dw_(dw, "dw");
    const T* xb = x_.get();
    const T* wb = w_.get();
    const T* bb = opt_ptr(b_);
    const T* dyb = dy_.get();
    T* dxb = dx_.get();
    T* dwb = dw_.get();
    std::vector<T> dbv(static_cast<std::size_t>(s.C), T(0));
    // One work item per channel: dx[:,:,c], dw[c,:], dbias[c] are written only by it.
    Kokkos::parallel_for("conv1d_bwd", Range(0, s.C), [&](std::int64_t c) {
      for (std::int64_t k = 0; k < s.W; ++k) dwb[c * s.W + k] = 0;
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t t = 0; t < s.L; ++t) dxb[(b * s.L + t) * s.C + c] = 0;
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t t = 0; t < s.L; ++t) {
          const std::int64_t i = (b * s.L + t) * s.C + c;
          T du = dyb[i];
          if (silu) du *= host::dsilu(conv_u(xb, wb, bb, seq_idx, s, b, t, c));
          dbv[static_cast<std::size_t>(c)] += du;
          const std::int64_t st = seq_idx ? (*seq_idx)[b * s.L + t] : 0;
          for (std::int64_t k = 0; k < s.W; ++k) {
            const std::int64_t src = t - (s.W - 1) + k;
            if (src < 0 || (seq_idx && (*seq_idx)[b * s.L + src] != st)) continue;
            dxb[(b * s.L + src) * s.C + c] += wb[c * s.W + k] * du;
            dwb[c * s.W + k] += xb[(b * s.L + src) * s.C + c] * du;
          }
        }
    });
    if (dbias) {
      Out<T> db_(*dbias, "dbias");
      std::copy(dbv.begin(), dbv.end(), db_.get());
    }
  });
}

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
void gated_rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w,
                       std::int64_t groups, double eps) {
  const std::int64_t C = w.numel();
  HCP_CHECK(groups > 0 && C % groups == 0, "gated_rmsnorm: groups (", groups, ") must divide channels (", C, ")");
  HCP_CHECK(C > 0 && x.numel() % C == 0 && z.numel() == x.numel(), "gated_rmsnorm: x ", shape_str(x.shape()),
            " / z ", shape_str(z.shape()), " are not [M, C=", C, "]");
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
