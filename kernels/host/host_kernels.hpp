// The host (Kokkos) bodies of the kernel API's ops: the CPU path and the oracle the CUDA kernels are
// tested against. The API (kernels/api) checks the shapes (kernels/shape_rules.hpp) and routes host
// tensors here; the signatures match the CUDA twins' (kernels/cuda/cuda_kernels.hpp).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"

namespace hcp::kernels::host {

// attention
void attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p);
void attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& o, const Tensor& lse, const Tensor& dout, const AttnParams& p);
void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_b, const Tensor& lse_b);

// conv1d
void conv1d_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu);
void conv1d_step(Tensor& y, Tensor& window, const Tensor& x, const Tensor& w, const Tensor* bias, bool silu);
void conv1d_bwd(Tensor& dx, Tensor& dw, Tensor* dbias, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu, const Tensor& dy);

// dense
void linear_fwd(Tensor& y, const Tensor& x, const Tensor& W, const Tensor* bias);
void linear_bwd(Tensor* dx, Tensor* dW, Tensor* dbias, const Tensor& x, const Tensor& W, const Tensor& dy);
void rope_apply(Tensor& y, const Tensor& x, const std::vector<std::int64_t>& pos, double theta, std::int64_t rd,
                double sign);
void embedding_fwd(Tensor& y, const Tensor& table, const std::vector<std::int64_t>& ids);
void embedding_bwd(Tensor& dtable, const std::vector<std::int64_t>& ids, const Tensor& dy);
double cross_entropy_fwd(const Tensor& logits, const std::vector<std::int64_t>& labels, std::int64_t ignore,
                         std::int64_t* count);
void cross_entropy_bwd(Tensor& dlogits, const Tensor& logits, const std::vector<std::int64_t>& labels,
                       std::int64_t ignore, double scale);
void add(Tensor& y, const Tensor& a, const Tensor& b);
void axpy(Tensor& y, double alpha, const Tensor& x);

// moe
void router_fwd(Tensor& scores, MoeRouting& route, Tensor& topk_w, const Tensor& logits, const Tensor* bias,
                const RouterParams& p);
void router_bwd(Tensor& dlogits, const Tensor& scores, const MoeRouting& route, const Tensor& dtopk_w,
                const Tensor* dscores, const RouterParams& p);
double moe_aux_loss_fwd(const Tensor& scores, const std::vector<double>& shares, const RouterParams& p);
void moe_aux_loss_bwd(Tensor& dscores, const Tensor& scores, const std::vector<double>& shares, const RouterParams& p,
                      double dloss);
void moe_permute(Tensor& xp, MoeRouting& route, const Tensor& x);
void moe_permute_bwd(Tensor& dx, const Tensor& dxp, const MoeRouting& route);
void moe_combine_fwd(Tensor& y, const Tensor& yp, const MoeRouting& route, const Tensor& topk_w);
void moe_combine_bwd(Tensor& dyp, Tensor& dtopk_w, const Tensor& dy, const Tensor& yp, const MoeRouting& route,
                     const Tensor& topk_w);
void expert_mlp_fwd(Tensor& yp, Tensor& h, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const std::vector<std::int64_t>& counts, Activation act);
void expert_mlp_bwd(Tensor& dxp, Tensor& dW1, Tensor& dW2, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const Tensor& h, const std::vector<std::int64_t>& counts, Activation act, const Tensor& dyp);

// norms
void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps);
void rmsnorm_bwd(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy);
void gated_rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w, std::int64_t groups,
                       double eps);
void gated_rmsnorm_bwd(Tensor& dx, Tensor& dz, Tensor& dw, const Tensor& x, const Tensor& z, const Tensor& w,
                       const Tensor& rstd, std::int64_t groups, const Tensor& dy);

// optim
double sum_squares(const Tensor& x);
void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s);

// ssd
void ssd_fwd(Tensor& y, Tensor* final_states, const SsdInputs& in, const SsdParams& p);
void ssd_bwd(const SsdGrads& g, const SsdInputs& in, const Tensor& dy, const Tensor* dfinal, const SsdParams& p);
void ssd_run_decay(Tensor& decay, const SsdInputs& in, const SsdParams& p);
void ssd_init_state_fwd(Tensor& y, const SsdInputs& in, const SsdParams& p);
void ssd_init_state_bwd(const SsdStateGrads& g, const SsdInputs& in, const Tensor* dy, const Tensor* ddecay,
                        const SsdParams& p);
void ssd_state_compose(Tensor& A, Tensor& B, const Tensor& A_prev, const Tensor& B_prev);
void ssd_state_dot(Tensor& da, const Tensor& G, const Tensor& X);
void ssd_step(Tensor& y, Tensor& state, const SsdInputs& in, const SsdParams& p);
void ssd_state_scan_fwd(Tensor& Sin, const Tensor& S, const Tensor& a, const std::vector<std::int64_t>& order,
                        const std::vector<std::int64_t>& off);
void ssd_state_scan_bwd(Tensor& dS, Tensor& da, const Tensor& dSin, const Tensor& Sin, const Tensor& a,
                        const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& off);

}  // namespace hcp::kernels::host
