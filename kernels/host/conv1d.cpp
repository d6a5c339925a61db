// Causal depthwise conv1d (+ SiLU, seq_idx resets) on the host (CUDA twin: kernels/cuda/conv1d.cu).
#include <optional>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/host/host_kernels.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::check_conv;
using rules::ConvShape;
using rules::kMaxConvWidth;
namespace {

using host::In;
using host::Out;
using host::Range;

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

template <class T>
const T* opt_ptr(const std::optional<In<T>>& v) {
  return v ? v->get() : nullptr;
}

}  // namespace

void host::conv1d_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
                      const std::vector<std::int64_t>* seq_idx, bool silu) {
  const ConvShape s = check_conv(x, w, bias, seq_idx);
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

void host::conv1d_step(Tensor& y, Tensor& window, const Tensor& x, const Tensor& w, const Tensor* bias, bool silu) {
  const std::int64_t B = x.size(0), C = w.size(0), W = w.size(1);
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x"), w_(w, "w");
    std::optional<In<T>> b_;
    if (bias) b_.emplace(*bias, "bias");
    Out<T> y_(y, "y"), win_(window, "window", true);
    const T *xb = x_.get(), *wb = w_.get(), *bb = opt_ptr(b_);
    T *yb = y_.get(), *wv = win_.get();
    Kokkos::parallel_for("conv1d_step", Range(0, B * C), [&](std::int64_t i) {
      const std::int64_t b = i / C, c = i % C;
      T* col = wv + b * (W - 1) * C + c;  // this channel's window rows, stride C, oldest first
      T u = bb ? bb[c] : T(0);            // conv_u's order: the oldest tap first, the new token last
      for (std::int64_t k = 0; k < W - 1; ++k) u += wb[c * W + k] * col[k * C];
      u += wb[c * W + W - 1] * xb[i];
      yb[i] = silu ? host::silu(u) : u;
      for (std::int64_t k = 0; k + 1 < W - 1; ++k) col[k * C] = col[(k + 1) * C];
      if (W > 1) col[(W - 2) * C] = xb[i];
    });
  });
}

void host::conv1d_bwd(Tensor& dx, Tensor& dw, Tensor* dbias, const Tensor& x, const Tensor& w, const Tensor* bias,
                      const std::vector<std::int64_t>* seq_idx, bool silu, const Tensor& dy) {
  const ConvShape s = check_conv(x, w, bias, seq_idx);
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
    // One work item per channel: dx[:,:,c], dw[c,:], dbias[c] are written only by it. dw and dbias
    // sum over every token: fp64 accumulators keep their error at the inputs' rounding at any length.
    Kokkos::parallel_for("conv1d_bwd", Range(0, s.C), [&](std::int64_t c) {
      double dwacc[kMaxConvWidth] = {}, dbacc = 0;
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t t = 0; t < s.L; ++t) dxb[(b * s.L + t) * s.C + c] = 0;
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t t = 0; t < s.L; ++t) {
          const std::int64_t i = (b * s.L + t) * s.C + c;
          T du = dyb[i];
          if (silu) du *= host::dsilu(conv_u(xb, wb, bb, seq_idx, s, b, t, c));
          dbacc += du;
          const std::int64_t st = seq_idx ? (*seq_idx)[b * s.L + t] : 0;
          for (std::int64_t k = 0; k < s.W; ++k) {
            const std::int64_t src = t - (s.W - 1) + k;
            if (src < 0 || (seq_idx && (*seq_idx)[b * s.L + src] != st)) continue;
            dxb[(b * s.L + src) * s.C + c] += wb[c * s.W + k] * du;
            dwacc[k] += xb[(b * s.L + src) * s.C + c] * du;
          }
        }
      for (std::int64_t k = 0; k < s.W; ++k) dwb[c * s.W + k] = static_cast<T>(dwacc[k]);
      dbv[static_cast<std::size_t>(c)] = static_cast<T>(dbacc);
    });
    if (dbias) {
      Out<T> db_(*dbias, "dbias");
      std::copy(dbv.begin(), dbv.end(), db_.get());
    }
  });
}

}  // namespace hcp::kernels
