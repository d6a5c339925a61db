// The kernel API for attention forward, backward and the merge of partial results: each entry point checks its shapes,
// then routes the call by the tensors' memory space (kernels/api/route.hpp).
#include <string>
#include <vector>

#include "kernels/api/route.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::check_attn;
using rules::require_numel;
using rules::Shapes;

const char* to_string(AttnBwdKernel k) {
  switch (k) {
    case AttnBwdKernel::Split:
      return "split";
    case AttnBwdKernel::Fused:
      return "fused";
    case AttnBwdKernel::FusedUnordered:
      return "fused_unordered";
    case AttnBwdKernel::FusedOneDqWarp:
      return "fused_one_dq_warp";
    case AttnBwdKernel::Auto:
      break;
  }
  return "auto";
}
AttnBwdKernel attn_bwd_kernel_from_string(const std::string& s) {
  for (AttnBwdKernel k : kAttnBwdKernels)
    if (s == to_string(k)) return k;
  HCP_CHECK(false, "attention backward kernel \"", s,
            "\": expected auto, split, fused, fused_unordered or fused_one_dq_warp");
  return AttnBwdKernel::Auto;
}

void attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p) {
  const Shapes s = check_attn(q, k, v, p);
  require_numel(o, q.numel(), "attention_fwd: o");
  require_numel(lse, s.tq * s.H, "attention_fwd: lse");
  HCP_ROUTE(q, attention_fwd, o, lse, q, k, v, p);
}

void attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& o, const Tensor& lse, const Tensor& dout, const AttnParams& p) {
  const Shapes s = check_attn(q, k, v, p);
  require_numel(dq, q.numel(), "attention_bwd: dq");
  require_numel(dk, k.numel(), "attention_bwd: dk");
  require_numel(dv, v.numel(), "attention_bwd: dv");
  require_numel(o, q.numel(), "attention_bwd: o");
  require_numel(dout, q.numel(), "attention_bwd: dout");
  require_numel(lse, s.tq * s.H, "attention_bwd: lse");
  HCP_ROUTE(q, attention_bwd, dq, dk, dv, q, k, v, o, lse, dout, p);
}

void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_b, const Tensor& lse_b) {
  HCP_CHECK(o.shape() == o_b.shape() && lse.numel() == lse_b.numel() && lse.numel() > 0 && o.numel() % lse.numel() == 0,
            "attention_merge: shapes o ", shape_str(o.shape()), ", o_b ", shape_str(o_b.shape()), ", lse ",
            shape_str(lse.shape()), ", lse_b ", shape_str(lse_b.shape()));
  HCP_ROUTE(o, attention_merge, o, lse, o_b, lse_b);
}

}  // namespace hcp::kernels
