// The kernel API for the Mamba2 SSD scan and its state pieces: each entry point checks its shapes, then routes the
// call by the tensors' memory space (kernels/api/route.hpp).
#include <vector>

#include "kernels/api/route.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::check_compose;
using rules::check_ssd;
using rules::check_state_scan;
using rules::require_numel;

void ssd_fwd(Tensor& y, Tensor* final_states, const SsdInputs& in, const SsdParams& p) {
  check_ssd(in, p);
  require_numel(y, in.x->numel(), "ssd_fwd: y");
  if (final_states) require_numel(*final_states, p.batch * p.heads * p.head_dim * p.d_state, "ssd_fwd: final_states");
  HCP_ROUTE(*in.x, ssd_fwd, y, final_states, in, p);
}

void ssd_bwd(const SsdGrads& g, const SsdInputs& in, const Tensor& dy, const Tensor* dfinal, const SsdParams& p) {
  check_ssd(in, p);
  HCP_CHECK(g.dx && g.ddt && g.dA_log && g.dB && g.dC, "ssd_bwd: dx, ddt, dA_log, dB, dC are required");
  require_numel(dy, in.x->numel(), "ssd_bwd: dy");
  require_numel(*g.dx, in.x->numel(), "ssd_bwd: dx");
  require_numel(*g.ddt, in.dt->numel(), "ssd_bwd: ddt");
  require_numel(*g.dA_log, p.heads, "ssd_bwd: dA_log");
  require_numel(*g.dB, in.Bm->numel(), "ssd_bwd: dB");
  require_numel(*g.dC, in.Cm->numel(), "ssd_bwd: dC");
  HCP_CHECK(!g.dinit_states || in.init_states, "ssd_bwd: dinit_states requested without init_states");
  HCP_ROUTE(*in.x, ssd_bwd, g, in, dy, dfinal, p);
}

void ssd_run_decay(Tensor& decay, const SsdInputs& in, const SsdParams& p) {
  check_ssd(in, p);
  HCP_CHECK(!in.seq_idx, "ssd_run_decay: every row must be one sequence's run (no seq_idx)");
  require_numel(decay, p.batch * p.heads, "ssd_run_decay: decay [B,H]");
  HCP_ROUTE(*in.x, ssd_run_decay, decay, in, p);
}

void ssd_init_state_fwd(Tensor& y, const SsdInputs& in, const SsdParams& p) {
  check_ssd(in, p);
  HCP_CHECK(in.init_states, "ssd_init_state_fwd: init_states are required");
  HCP_CHECK(!in.seq_idx, "ssd_init_state_fwd: every row must be one sequence's run (no seq_idx)");
  require_numel(y, in.x->numel(), "ssd_init_state_fwd: y");
  HCP_ROUTE(*in.x, ssd_init_state_fwd, y, in, p);
}

void ssd_init_state_bwd(const SsdStateGrads& g, const SsdInputs& in, const Tensor* dy, const Tensor* ddecay,
                        const SsdParams& p) {
  check_ssd(in, p);
  HCP_CHECK(in.init_states, "ssd_init_state_bwd: init_states are required");
  HCP_CHECK(!in.seq_idx, "ssd_init_state_bwd: every row must be one sequence's run (no seq_idx)");
  HCP_CHECK(g.ddt && g.dA_log, "ssd_init_state_bwd: ddt and dA_log are required");
  HCP_CHECK(!dy || (g.dC && g.dinit_states), "ssd_init_state_bwd: dy needs dC and dinit_states");
  require_numel(*g.ddt, in.dt->numel(), "ssd_init_state_bwd: ddt");
  if (dy) {
    require_numel(*dy, in.x->numel(), "ssd_init_state_bwd: dy");
    require_numel(*g.dC, in.Cm->numel(), "ssd_init_state_bwd: dC");
    require_numel(*g.dinit_states, p.batch * p.heads * p.head_dim * p.d_state, "ssd_init_state_bwd: dinit_states");
  }
  if (ddecay) require_numel(*ddecay, p.batch * p.heads, "ssd_init_state_bwd: ddecay [B,H]");
  HCP_ROUTE(*in.x, ssd_init_state_bwd, g, in, dy, ddecay, p);
}

void ssd_step(Tensor& y, Tensor& state, const SsdInputs& in, const SsdParams& p) {
  check_ssd(in, p);
  HCP_CHECK(p.seqlen == 1, "ssd_step: one token per row (seqlen 1), got ", p.seqlen);
  HCP_CHECK(!in.seq_idx && !in.init_states, "ssd_step: the state is `state`; no seq_idx or init_states");
  require_numel(y, in.x->numel(), "ssd_step: y");
  require_numel(state, p.batch * p.heads * p.head_dim * p.d_state, "ssd_step: state [B,H,P,N]");
  HCP_CHECK(state.dtype() == acc_dtype(in.x->dtype()) && state.space() == in.x->space() && state.is_contiguous(),
            "ssd_step: state must be a contiguous ", to_string(acc_dtype(in.x->dtype())), " tensor beside x");
  HCP_ROUTE(*in.x, ssd_step, y, state, in, p);
}

void ssd_state_compose(Tensor& A, Tensor& B, const Tensor& A_prev, const Tensor& B_prev) {
  check_compose(A, B, A_prev, B_prev, "ssd_state_compose");
  HCP_ROUTE(B, ssd_state_compose, A, B, A_prev, B_prev);
}

void ssd_state_dot(Tensor& da, const Tensor& G, const Tensor& X) {
  HCP_CHECK(
      G.dim() == 4 && X.shape() == G.shape() && da.dim() == 2 && da.size(0) == G.size(0) && da.size(1) == G.size(1),
      "ssd_state_dot: need G, X [rows,H,P,N] and da [rows,H]");
  HCP_CHECK(X.dtype() == G.dtype() && da.dtype() == G.dtype() && X.space() == G.space() && da.space() == G.space(),
            "ssd_state_dot: tensors must share dtype and memory space");
  HCP_ROUTE(G, ssd_state_dot, da, G, X);
}

void ssd_state_scan_fwd(Tensor& Sin, const Tensor& S, const Tensor& a, const std::vector<std::int64_t>& order,
                        const std::vector<std::int64_t>& off) {
  check_state_scan(S, a, Sin, order, off, "ssd_state_scan_fwd");
  HCP_ROUTE(S, ssd_state_scan_fwd, Sin, S, a, order, off);
}

void ssd_state_scan_bwd(Tensor& dS, Tensor& da, const Tensor& dSin, const Tensor& Sin, const Tensor& a,
                        const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& off) {
  check_state_scan(Sin, a, dSin, order, off, "ssd_state_scan_bwd");
  HCP_CHECK(dS.shape() == Sin.shape() && da.shape() == a.shape(), "ssd_state_scan_bwd: dS and da must match S and a");
  HCP_ROUTE(Sin, ssd_state_scan_bwd, dS, da, dSin, Sin, a, order, off);
}

}  // namespace hcp::kernels
