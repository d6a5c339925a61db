// The kernel API for the causal depthwise conv1d (SiLU), forward and backward: each entry point checks its shapes, then
// routes the call by the tensors' memory space (kernels/api/route.hpp).
#include <initializer_list>
#include <vector>

#include "kernels/api/route.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::check_conv;
using rules::ConvShape;
using rules::require_numel;

void conv1d_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu) {
  require_numel(y, x.numel(), "conv1d_fwd: y");
  HCP_ROUTE(x, conv1d_fwd, y, x, w, bias, seq_idx, silu);
}

void conv1d_step(Tensor& y, Tensor& window, const Tensor& x, const Tensor& w, const Tensor* bias, bool silu) {
  HCP_CHECK(w.dim() == 2 && w.size(1) >= 1 && w.size(1) <= rules::kMaxConvWidth,
            "conv1d_step: w must be [C,W], W in [1, ", rules::kMaxConvWidth, "]");
  const std::int64_t C = w.size(0), W = w.size(1);
  HCP_CHECK(x.dim() == 2 && x.size(1) == C, "conv1d_step: x must be [B,", C, "], got ", shape_str(x.shape()));
  const std::int64_t B = x.size(0);
  HCP_CHECK(window.dim() == 3 && window.size(0) == B && window.size(1) == W - 1 && window.size(2) == C,
            "conv1d_step: window must be [", B, ",", W - 1, ",", C, "], got ", shape_str(window.shape()));
  require_numel(y, x.numel(), "conv1d_step: y");
  if (bias) require_numel(*bias, C, "conv1d_step: bias");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&y, &window, &w, bias})
    if (t)
      HCP_CHECK(t->dtype() == x.dtype() && t->space() == x.space() && t->is_contiguous(),
                "conv1d_step: every tensor contiguous, in x's dtype and memory space");
  HCP_ROUTE(x, conv1d_step, y, window, x, w, bias, silu);
}

void conv1d_bwd(Tensor& dx, Tensor& dw, Tensor* dbias, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu, const Tensor& dy) {
  const ConvShape s = check_conv(x, w, bias, seq_idx);
  require_numel(dx, x.numel(), "conv1d_bwd: dx");
  require_numel(dw, w.numel(), "conv1d_bwd: dw");
  require_numel(dy, x.numel(), "conv1d_bwd: dy");
  if (dbias) require_numel(*dbias, s.C, "conv1d_bwd: dbias");
  HCP_ROUTE(x, conv1d_bwd, dx, dw, dbias, x, w, bias, seq_idx, silu, dy);
}

}  // namespace hcp::kernels
