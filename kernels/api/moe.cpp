// The kernel API for the MoE router, load-balancing loss, permute/combine and grouped expert MLPs: each entry point
// checks its shapes, then routes the call by the tensors' memory space (kernels/api/route.hpp).
#include <vector>

#include "kernels/api/route.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::assignment_shares;
using rules::check_mlp;
using rules::check_router;
using rules::MlpShape;
using rules::permuted_rows;
using rules::require_numel;

void router_fwd(Tensor& scores, MoeRouting& route, Tensor& topk_w, const Tensor& logits, const Tensor* bias,
                const RouterParams& p) {
  check_router(p);
  HCP_CHECK(logits.dim() == 2 && logits.size(1) == p.experts, "router: logits must be [T, experts=", p.experts,
            "], got ", shape_str(logits.shape()));
  const std::int64_t Tn = logits.size(0), E = p.experts, K = p.topk;
  require_numel(scores, Tn * E, "router_fwd: scores [T,E]");
  require_numel(topk_w, Tn * K, "router_fwd: topk_w [T,k]");
  if (bias) require_numel(*bias, E, "router: correction bias [E]");
  route = MoeRouting{};
  route.topk = K;
  HCP_ROUTE(logits, router_fwd, scores, route, topk_w, logits, bias, p);
}

void router_bwd(Tensor& dlogits, const Tensor& scores, const MoeRouting& route, const Tensor& dtopk_w,
                const Tensor* dscores, const RouterParams& p) {
  check_router(p);
  const std::int64_t E = p.experts, K = p.topk;
  HCP_CHECK(scores.numel() % E == 0, "router_bwd: scores are not [T,E]");
  const std::int64_t Tn = scores.numel() / E;
  HCP_CHECK(route.idx.defined() && route.idx.numel() == Tn * K, "router_bwd: the routing has ",
            route.idx.defined() ? route.idx.numel() : 0, " assignments, expected ", Tn * K);
  require_numel(dtopk_w, Tn * K, "router_bwd: dtopk_w");
  require_numel(dlogits, Tn * E, "router_bwd: dlogits");
  if (dscores) require_numel(*dscores, Tn * E, "router_bwd: dscores");
  HCP_ROUTE(scores, router_bwd, dlogits, scores, route, dtopk_w, dscores, p);
}

double moe_aux_loss_fwd(const Tensor& scores, const MoeRouting& route, const RouterParams& p) {
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
  const auto f = assignment_shares(route, p, Tn);
  return HCP_ROUTE(scores, moe_aux_loss_fwd, scores, f, p);
}

void moe_aux_loss_bwd(Tensor& dscores, const Tensor& scores, const MoeRouting& route, const RouterParams& p,
                      double dloss) {
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
  require_numel(dscores, scores.numel(), "moe_aux_loss_bwd: dscores");
  const auto f = assignment_shares(route, p, Tn);
  HCP_ROUTE(scores, moe_aux_loss_bwd, dscores, scores, f, p, dloss);
}

void moe_permute(Tensor& xp, MoeRouting& route, const Tensor& x) {
  HCP_CHECK(x.dim() == 2, "moe_permute: x must be [T,C]");
  const std::int64_t Tn = x.size(0), C = x.size(1), K = route.topk;
  const std::int64_t TK = route.idx.defined() ? route.idx.numel() : 0;
  HCP_CHECK(Tn > 0 && TK == Tn * K, "moe_permute: ", TK, " assignments for ", Tn, " tokens of ", K);
  require_numel(xp, TK * C, "moe_permute: xp [T*k,C]");
  HCP_ROUTE(x, moe_permute, xp, route, x);
}

void moe_permute_bwd(Tensor& dx, const Tensor& dxp, const MoeRouting& route) {
  const std::int64_t TK = permuted_rows(route, "moe_permute_bwd"), topk = route.topk, Tn = TK / topk;
  HCP_CHECK(TK > 0 && dxp.numel() % TK == 0, "moe_permute_bwd: dxp is not [T*k, C]");
  const std::int64_t C = dxp.numel() / TK;
  require_numel(dx, Tn * C, "moe_permute_bwd: dx [T,C]");
  HCP_ROUTE(dxp, moe_permute_bwd, dx, dxp, route);
}

void moe_combine_fwd(Tensor& y, const Tensor& yp, const MoeRouting& route, const Tensor& topk_w) {
  const std::int64_t TK = permuted_rows(route, "moe_combine");
  HCP_CHECK(TK > 0 && yp.numel() % TK == 0 && topk_w.numel() == TK, "moe_combine: yp / topk_w shapes");
  const std::int64_t C = yp.numel() / TK, K = topk_w.dim() == 2 ? topk_w.size(1) : 1, Tn = TK / K;
  require_numel(y, Tn * C, "moe_combine: y [T,C]");
  HCP_ROUTE(yp, moe_combine_fwd, y, yp, route, topk_w);
}

void moe_combine_bwd(Tensor& dyp, Tensor& dtopk_w, const Tensor& dy, const Tensor& yp, const MoeRouting& route,
                     const Tensor& topk_w) {
  const std::int64_t TK = permuted_rows(route, "moe_combine_bwd");
  HCP_CHECK(TK > 0 && yp.numel() % TK == 0 && topk_w.numel() == TK, "moe_combine_bwd: shapes");
  const std::int64_t C = yp.numel() / TK, K = topk_w.dim() == 2 ? topk_w.size(1) : 1;
  require_numel(dyp, yp.numel(), "moe_combine_bwd: dyp");
  require_numel(dtopk_w, TK, "moe_combine_bwd: dtopk_w");
  require_numel(dy, (TK / K) * C, "moe_combine_bwd: dy");
  HCP_ROUTE(yp, moe_combine_bwd, dyp, dtopk_w, dy, yp, route, topk_w);
}

void expert_mlp_fwd(Tensor& yp, Tensor& h, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const std::vector<std::int64_t>& counts, Activation act) {
  const MlpShape s = check_mlp(xp, W1, W2, counts, act);
  require_numel(yp, s.rows * s.C, "expert_mlp_fwd: yp");
  require_numel(h, s.rows * s.F1, "expert_mlp_fwd: h");
  HCP_ROUTE(xp, expert_mlp_fwd, yp, h, xp, W1, W2, counts, act);
}

void expert_mlp_bwd(Tensor& dxp, Tensor& dW1, Tensor& dW2, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const Tensor& h, const std::vector<std::int64_t>& counts, Activation act, const Tensor& dyp) {
  const MlpShape s = check_mlp(xp, W1, W2, counts, act);
  require_numel(dxp, xp.numel(), "expert_mlp_bwd: dxp");
  require_numel(dW1, W1.numel(), "expert_mlp_bwd: dW1");
  require_numel(dW2, W2.numel(), "expert_mlp_bwd: dW2");
  require_numel(h, s.rows * s.F1, "expert_mlp_bwd: h");
  require_numel(dyp, s.rows * s.C, "expert_mlp_bwd: dyp");
  HCP_ROUTE(xp, expert_mlp_bwd, dxp, dW1, dW2, xp, W1, W2, h, counts, act, dyp);
}

}  // namespace hcp::kernels
