// CUDA implementations behind kernels/kernels.hpp (same signatures and semantics). The public
// functions route here when their tensors live on Space::Cuda; shapes are checked there first.
// bf16 storage computes in fp32, fp32 in fp32, fp64 in fp64.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace hcp::kernels {
struct AttnParams;
struct SsdParams;
struct SsdInputs;
struct SsdGrads;
struct SsdStateGrads;
struct RouterParams;
struct MoeRouting;
enum class Activation;
struct AdamWStep;
}  // namespace hcp::kernels

namespace hcp::kernels::cuda_impl {

void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps);
void rmsnorm_bwd(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy);
void gated_rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w, std::int64_t groups,
                       double eps);
void gated_rmsnorm_bwd(Tensor& dx, Tensor& dz, Tensor& dw, const Tensor& x, const Tensor& z, const Tensor& w,
                       const Tensor& rstd, std::int64_t groups, const Tensor& dy);
void conv1d_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu);
void conv1d_step(Tensor& y, Tensor& window, const Tensor& x, const Tensor& w, const Tensor* bias, bool silu);
void conv1d_bwd(Tensor& dx, Tensor& dw, Tensor* dbias, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu, const Tensor& dy);
void linear_fwd(Tensor& y, const Tensor& x, const Tensor& W, const Tensor* bias);
void linear_bwd(Tensor* dx, Tensor* dW, Tensor* dbias, const Tensor& x, const Tensor& W, const Tensor& dy);
void rope_apply(Tensor& y, const Tensor& x, const std::vector<std::int64_t>& positions, double theta,
                std::int64_t rotary_dim, double sign);
void embedding_fwd(Tensor& y, const Tensor& table, const std::vector<std::int64_t>& ids);
void embedding_bwd(Tensor& dtable, const std::vector<std::int64_t>& ids, const Tensor& dy);
double cross_entropy_fwd(const Tensor& logits, const std::vector<std::int64_t>& labels, std::int64_t ignore,
                         std::int64_t* count);
void cross_entropy_bwd(Tensor& dlogits, const Tensor& logits, const std::vector<std::int64_t>& labels,
                       std::int64_t ignore, double scale);
void add(Tensor& y, const Tensor& a, const Tensor& b);
// Attention: lse is fp32 (fp64 for fp64 inputs) for every input dtype.
void attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p);
void attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& o, const Tensor& lse, const Tensor& dout, const AttnParams& p);
void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_b, const Tensor& lse_b);
// SSD (sequential per head, chunk-start recomputation in the backward) and state passing.
void ssd_fwd(Tensor& y, Tensor* final_states, const SsdInputs& in, const SsdParams& p);
void ssd_bwd(const SsdGrads& g, const SsdInputs& in, const Tensor& dy, const Tensor* dfinal_states, const SsdParams& p);
void ssd_run_decay(Tensor& decay, const SsdInputs& in, const SsdParams& p);
void ssd_state_scan_fwd(Tensor& Sin, const Tensor& S, const Tensor& a, const std::vector<std::int64_t>& order,
                        const std::vector<std::int64_t>& off);
void ssd_state_scan_bwd(Tensor& dS, Tensor& da, const Tensor& dSin, const Tensor& Sin, const Tensor& a,
                        const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& off);
void ssd_state_compose(Tensor& A, Tensor& B, const Tensor& A_prev, const Tensor& B_prev);
void ssd_state_dot(Tensor& da, const Tensor& G, const Tensor& X);
void ssd_step(Tensor& y, Tensor& state, const SsdInputs& in, const SsdParams& p);
void ssd_init_state_fwd(Tensor& y, const SsdInputs& in, const SsdParams& p);
void ssd_init_state_bwd(const SsdStateGrads& g, const SsdInputs& in, const Tensor* dy, const Tensor* ddecay,
                        const SsdParams& p);
void axpy(Tensor& y, double alpha, const Tensor& x);
double sum_squares(const Tensor& x);
void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s);

// MoE.
// The routing's index tensors live on the device; only the counts come to the host (router_fwd).
void router_fwd(Tensor& scores, MoeRouting& route, Tensor& topk_w, const Tensor& logits, const Tensor* correction_bias,
                const RouterParams& p);
void router_bwd(Tensor& dlogits, const Tensor& scores, const MoeRouting& route, const Tensor& dtopk_w,
                const Tensor* dscores, const RouterParams& p);
void moe_permute(Tensor& xp, MoeRouting& route, const Tensor& x);
void moe_permute_bwd(Tensor& dx, const Tensor& dxp, const MoeRouting& route);
void moe_combine_fwd(Tensor& y, const Tensor& yp, const MoeRouting& route, const Tensor& topk_w);
void moe_combine_bwd(Tensor& dyp, Tensor& dtopk_w, const Tensor& dy, const Tensor& yp, const MoeRouting& route,
                     const Tensor& topk_w);
// shares: each expert's share of the assignments (the host computes them from the routing's counts).
double moe_aux_loss_fwd(const Tensor& scores, const std::vector<double>& shares, const RouterParams& p);
void moe_aux_loss_bwd(Tensor& dscores, const Tensor& scores, const std::vector<double>& shares, const RouterParams& p,
                      double dloss);
void expert_mlp_fwd(Tensor& yp, Tensor& h, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const std::vector<std::int64_t>& counts, Activation act);
void expert_mlp_bwd(Tensor& dxp, Tensor& dW1, Tensor& dW2, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const Tensor& h, const std::vector<std::int64_t>& counts, Activation act, const Tensor& dyp);

// Grouped GEMM, one launch: C_g [M_g,N] = op(A_g) op(B_g) (row-major, ld* in elements; op(A) = A^T
// when trans_a, A_g then [K_g,M_g]; op(B) = B^T when trans_b, B_g then [N,K_g]). Every group has the
// same N; M_g and K_g may differ and be 0 (K_g = 0 writes zeros). All pointers on the device, dtype dt.
struct GemmGroupDesc {
  const void* A;
  const void* B;
  void* C;
  std::int64_t M, N, K, lda, ldb, ldc;
};
void grouped_gemm(bool trans_a, bool trans_b, const std::vector<GemmGroupDesc>& groups, DType dt);

}  // namespace hcp::kernels::cuda_impl
