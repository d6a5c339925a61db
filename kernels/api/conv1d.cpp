// The kernel API for the causal depthwise conv1d (SiLU), forward and backward: each entry point checks its shapes, then
// routes the call by the tensors' memory space (kernels/api/route.hpp).
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
