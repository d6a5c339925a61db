// Backend-neutral kernel API. Every op takes tensors (outputs first, then const inputs, then
// parameters) and dispatches by memory space: host tensors run the Kokkos reference kernels in
// kernels/host, CUDA tensors the kernels in kernels/cuda (when built). Compute precision follows
// the first input: fp64 inputs compute in fp64, fp32 and bf16 inputs compute in fp32 (bf16 is
// widened on entry and rounded on exit). Tensors must be contiguous. Backward outputs are
// overwritten (never accumulated) unless the op says otherwise.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "core/seq_layout.hpp"
#include "core/tensor.hpp"
#include "kernels/attention_segment.hpp"

namespace hcp::kernels {

// =============================== attention ======================================================
enum class Mask { None, Causal };

// Which kernels the CUDA tensor-core backward (bf16, head_dim 64 or 128) runs. Auto is what every
// layer uses: a pure function of the head dim (kernels/cuda/attention/attention_tc.cu). The others
// name one form each, so that bench_kernels can time them side by side (bench.variant). Split: a dQ
// kernel and a dK/dV kernel; Fused: one dK/dV kernel that also forms dQ, adding it in a fixed order.
// Both are bitwise repeatable. FusedUnordered (benchmarks only, never chosen by Auto): the fused
// kernel with dQ's adds in arrival order, not bitwise repeatable; it measures what the order costs.
// FusedOneDqWarp (benchmarks only): the fused kernel with one warp adding dQ instead of two, the
// earlier form, bitwise repeatable; it measures what the second warp gains.
// Host kernels and other dtypes or head dims ignore it.
enum class AttnBwdKernel { Auto, Split, Fused, FusedUnordered, FusedOneDqWarp };
// Every form, Auto first (bench.variant = all times them in this order).
inline constexpr AttnBwdKernel kAttnBwdKernels[] = {AttnBwdKernel::Auto, AttnBwdKernel::Split, AttnBwdKernel::Fused,
                                                    AttnBwdKernel::FusedUnordered, AttnBwdKernel::FusedOneDqWarp};
const char* to_string(AttnBwdKernel k);
AttnBwdKernel attn_bwd_kernel_from_string(const std::string& s);  // "auto", "split", ... (throws otherwise)

struct AttnParams {
  std::int64_t heads = 1, kv_heads = 1, head_dim = 1;
  double scale = 0;  // softmax scale; 0 means 1/sqrt(head_dim)
  Mask mask = Mask::Causal;
  std::vector<AttnSegment> segments;
  std::int64_t kv_tile = 64;  // keys per tile of the online softmax
  AttnBwdKernel bwd_kernel = AttnBwdKernel::Auto;
  double effective_scale() const { return softmax_scale(scale, head_dim); }
};

// Segments of a layout: sequence s of q_layout with sequence s of kv_layout, at their real lengths
// (a padded layout's pads are neither queries nor keys). With `bottom_right`,
// a causal diagonal is aligned to the end of both blocks (query i sees keys j <= i + lk - lq).
std::vector<AttnSegment> segments_from_layout(const SeqLayout& q_layout, const SeqLayout& kv_layout,
                                              bool bottom_right = false);

// o [Tq,H,D] (or [B,S,H,D]), lse [Tq,H] (fp32, or fp64 for fp64 inputs) <- q [Tq,H,D], k, v [Tkv,Hkv,D].
// Rows not covered by any segment get o = 0, lse = -inf. Rows whose keys are all masked likewise.
void attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const AttnParams& p);
// dq, dk, dv (overwritten) from the saved o and lse, and dout. Uses D = rowsum(dout * o).
void attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& o, const Tensor& lse, const Tensor& dout, const AttnParams& p);
// In place: (o, lse) <- LSE-weighted merge of (o, lse) and (o_b, lse_b). Shapes [T,H,D] / [T,H].
// Rows with lse_b = -inf are left unchanged. o may be an fp32 accumulator for a bf16 o_b.
void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_b, const Tensor& lse_b);

// =============================== Mamba2 SSD scan ================================================
struct SsdParams {
  std::int64_t batch = 1, seqlen = 1, heads = 1, head_dim = 1, groups = 1, d_state = 1;
  std::int64_t chunk = 128;
  bool dt_softplus = true;
  double dt_min = 0.0, dt_max = std::numeric_limits<double>::infinity();  // clamp after softplus
};
// Optional inputs are nullptr when absent. seq_idx [B*L] gives each token's sequence index (non-
// decreasing per row); the state resets where it changes.
struct SsdInputs {
  const Tensor* x = nullptr;                           // [B,L,H,P]
  const Tensor* dt = nullptr;                          // [B,L,H] raw (before dt_bias and softplus)
  const Tensor* A_log = nullptr;                       // [H], A = -exp(A_log)
  const Tensor* Bm = nullptr;                          // [B,L,G,N]
  const Tensor* Cm = nullptr;                          // [B,L,G,N]
  const Tensor* D = nullptr;                           // [H] skip, optional
  const Tensor* dt_bias = nullptr;                     // [H], optional
  const Tensor* init_states = nullptr;                 // [B,H,P,N], optional
  const std::vector<std::int64_t>* seq_idx = nullptr;  // [B*L], optional
};
// Chunked (state-space duality) forward. final_states [B,H,P,N] optional (state after the last token).
void ssd_fwd(Tensor& y, Tensor* final_states, const SsdInputs& in, const SsdParams& p);
// The plain sequential recurrence (test oracle only).
void ssd_sequential_fwd(Tensor& y, Tensor* final_states, const SsdInputs& in, const SsdParams& p);
struct SsdGrads {
  Tensor* dx = nullptr;            // [B,L,H,P]
  Tensor* ddt = nullptr;           // [B,L,H] w.r.t. raw dt
  Tensor* dA_log = nullptr;        // [H]
  Tensor* dB = nullptr;            // [B,L,G,N]
  Tensor* dC = nullptr;            // [B,L,G,N]
  Tensor* dD = nullptr;            // [H] (if D given)
  Tensor* ddt_bias = nullptr;      // [H] (if dt_bias given)
  Tensor* dinit_states = nullptr;  // [B,H,P,N] (if init_states given)
};
// Backward: chunk-boundary states are recomputed, then each chunk is reversed token by token.
// dfinal_states [B,H,P,N] optional.
void ssd_bwd(const SsdGrads& g, const SsdInputs& in, const Tensor& dy, const Tensor* dfinal_states, const SsdParams& p);

// ---- state passing (SSM context parallelism): every batch row is one run of consecutive tokens of a
// single sequence (no seq_idx), e.g. one CP rank's chunk of a sequence.
// decay [B,H] = exp(sum_t dt_t A_h): the factor by which a state entering the run reaches its end.
void ssd_run_decay(Tensor& decay, const SsdInputs& in, const SsdParams& p);
// y [B,L,H,P] += the initial state's term, y_t += exp(cumsum_{s<=t} dt_s A) C_t . S0, with
// S0 = in.init_states [B,H,P,N]. With ssd_fwd from a zero state, y becomes the run from S0 exactly.
void ssd_init_state_fwd(Tensor& y, const SsdInputs& in, const SsdParams& p);
struct SsdStateGrads {
  Tensor* dC = nullptr;            // [B,L,G,N]  accumulated
  Tensor* ddt = nullptr;           // [B,L,H]    accumulated (w.r.t. raw dt)
  Tensor* dA_log = nullptr;        // [H]        accumulated
  Tensor* ddt_bias = nullptr;      // [H]        accumulated (if dt_bias given)
  Tensor* dinit_states = nullptr;  // [B,H,P,N]  overwritten (needs dy)
};
// Backward of ssd_init_state_fwd (given dy) and of ssd_run_decay (given ddecay [B,H]); either may
// be nullptr. Unlike the other backward ops this one ADDS into dC, ddt, dA_log and ddt_bias.
void ssd_init_state_bwd(const SsdStateGrads& g, const SsdInputs& in, const Tensor* dy, const Tensor* ddecay,
                        const SsdParams& p);

// Scan of run states across the consecutive runs of each sequence (the state-passing step of SSM
// context parallelism). Slots index rows of S, a, Sin [slots,H,P,N] / [slots,H]; the runs of sequence
// q are slots order[off[q]] .. order[off[q+1]-1] in sequence order. Sin(first) = 0,
// Sin(k+1) = a_k Sin(k) + S_k (per head). Slots not named are left untouched.
void ssd_state_scan_fwd(Tensor& Sin, const Tensor& S, const Tensor& a, const std::vector<std::int64_t>& order,
                        const std::vector<std::int64_t>& off);
// Backward given dSin: dS_k = dSin-gradient reaching Sin(k+1), da_k = <that gradient, Sin(k)>.
void ssd_state_scan_bwd(Tensor& dS, Tensor& da, const Tensor& dSin, const Tensor& Sin, const Tensor& a,
                        const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& off);

// The scan's affine maps composed, per row i and head h ("B_prev, then B"): B[i,h] <- A[i,h] B_prev[i,h]
// + B[i,h] and A[i,h] <- A[i,h] A_prev[i,h]. B, B_prev [rows,H,P,N], A, A_prev [rows,H], fp32/fp64.
// The recursive-doubling state scan over CP ranks (cp/state_passing.hpp) runs on it.
void ssd_state_compose(Tensor& A, Tensor& B, const Tensor& A_prev, const Tensor& B_prev);
// da[i,h] = sum over (p, n) of G[i,h,p,n] X[i,h,p,n] (the decay's gradient of the state scan).
void ssd_state_dot(Tensor& da, const Tensor& G, const Tensor& X);

// =============================== Mamba2 decode: one token per sequence ===========================
// One step of the recurrence per batch row, from the state a prefill left (ssd_fwd's final_states)
// or the previous step. `in` as ssd_fwd's at seqlen 1 (x [B,1,H,P], dt [B,1,H], B, C [B,1,G,N]; no
// seq_idx or init_states); with dt_e = clamp(softplus(dt + dt_bias)) and a = exp(-dt_e exp(A_log)):
//   state[b,h] <- a state[b,h] + dt_e x[b,h] B[b,g(h)]^T,   y[b,h] = state[b,h] C[b,g(h)] + D[h] x[b,h].
// state [B,H,P,N] is updated in place and held in acc_dtype(x) (fp32 for bf16: it is not rounded
// to bf16 from step to step); y [B,1,H,P] in x's dtype.
void ssd_step(Tensor& y, Tensor& state, const SsdInputs& in, const SsdParams& p);

// =============================== causal depthwise conv1d ========================================
// y[b,t,c] = act(bias[c] + sum_k w[c,k] x[b,t-W+1+k,c]); taps before the sequence start (or in an
// earlier packed sequence by seq_idx [B*L]) are zero. x, y [B,L,C]; w [C,W]; bias [C] optional.
void conv1d_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu);
// One new token per sequence (decode): y[b,c] = act(bias[c] + sum_{k<W-1} w[c,k] window[b,k,c] +
// w[c,W-1] x[b,c]), then window[b] drops its oldest row and takes x[b] as its newest. window
// [B,W-1,C] holds the previous W-1 inputs, oldest first (zeros before a sequence's start); x, y
// [B,C] in window's dtype; w [C,W]; bias [C] optional.
void conv1d_step(Tensor& y, Tensor& window, const Tensor& x, const Tensor& w, const Tensor* bias, bool silu);
void conv1d_bwd(Tensor& dx, Tensor& dw, Tensor* dbias, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu, const Tensor& dy);

// =============================== norms ==========================================================
// RMSNorm over the last axis: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). x, y [M,C], rstd [M].
void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps);
void rmsnorm_bwd(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy);
// Gated group RMSNorm (Mamba2, norm after gate): g = x * silu(z), RMSNorm over groups of C/G
// channels of g, times w. x, z, y [M,C]; rstd [M,G].
void gated_rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w, std::int64_t groups,
                       double eps);
void gated_rmsnorm_bwd(Tensor& dx, Tensor& dz, Tensor& dw, const Tensor& x, const Tensor& z, const Tensor& w,
                       const Tensor& rstd, std::int64_t groups, const Tensor& dy);

// =============================== dense ops ======================================================
// The BLAS under the host dense products (OpenBLAS: its build line, e.g. "OpenBLAS 0.3.21 ...").
std::string host_blas();
// y [M,N] = x [M,K] W^T ([N,K]) + bias [N] (optional).
void linear_fwd(Tensor& y, const Tensor& x, const Tensor& W, const Tensor* bias);
// Any of dx, dW, dbias may be nullptr.
void linear_bwd(Tensor* dx, Tensor* dW, Tensor* dbias, const Tensor& x, const Tensor& W, const Tensor& dy);
// Rotary embedding (rotate-half) over the first rotary_dim channels, angle pos * theta^(-2i/rd).
// x, y [T,H,D]; positions [T] global ids. rope_bwd rotates by the negative angle.
void rope_fwd(Tensor& y, const Tensor& x, const std::vector<std::int64_t>& positions, double theta,
              std::int64_t rotary_dim);
void rope_bwd(Tensor& dx, const Tensor& dy, const std::vector<std::int64_t>& positions, double theta,
              std::int64_t rotary_dim);
// y [T,C] = table [V,C] rows ids [T]. Backward scatter-adds into dtable (overwritten first).
void embedding_fwd(Tensor& y, const Tensor& table, const std::vector<std::int64_t>& ids);
void embedding_bwd(Tensor& dtable, const std::vector<std::int64_t>& ids, const Tensor& dy);
// Sum over tokens with label != ignore of -log softmax(logits)[label]; logits [T,V].
// `count` receives the number of label tokens. Backward: dlogits = scale * (softmax - onehot), 0 on
// ignored rows (scale is usually dloss / global label count).
double cross_entropy_fwd(const Tensor& logits, const std::vector<std::int64_t>& labels, std::int64_t ignore,
                         std::int64_t* count);
void cross_entropy_bwd(Tensor& dlogits, const Tensor& logits, const std::vector<std::int64_t>& labels,
                       std::int64_t ignore, double scale);
// Elementwise helpers used by the layers: y = a + b; y = act(x) and its backward.
void add(Tensor& y, const Tensor& a, const Tensor& b);
void axpy(Tensor& y, double alpha, const Tensor& x);  // y += alpha x (y may be fp32 for a bf16 x)
// Sum of squares in fp64, in a fixed order (the same value for the same tensor and backend).
double sum_squares(const Tensor& x);
// One AdamW update of p (fp32 or fp64; m, v, g alike), in fp64 arithmetic per element:
// g' = g scale; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2; p -= lr ((m/bc1) / (sqrt(v/bc2) + eps) + wd p).
struct AdamWStep {
  double lr, beta1, beta2, bc1, bc2, eps, weight_decay, grad_scale;
};
void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s);

// =============================== MoE ============================================================
struct RouterParams {
  std::int64_t experts = 1, topk = 1;
  bool sigmoid = true;                       // sigmoid (NemotronH) or softmax scores
  std::int64_t n_group = 1, topk_group = 1;  // group-limited selection (n_group = 1: off)
  bool renormalize = true;                   // top-k weights divided by their sum
  double scaling = 1.0;                      // routed scaling factor
};
// The token -> expert routing of one MoE call, kept where the tensors live so that a GPU run builds
// and applies it on the device. Index arrays are F64 tensors holding integers (exact below 2^53):
//   idx [T*k]  expert of each (token t, slot j) at t*k + j, by decreasing selection score;
//   src [T*k]  the expert-sorted rows: row r is a copy of assignment src[r] (token src[r] / k);
//              stable: token order within an expert;
//   inv [T*k]  the row of assignment a (src[inv[a]] = a).
// counts [E] (rows per expert) are on the host: they size the grouped GEMMs and the EP exchange.
// router_fwd makes idx and counts (on the GPU, one copy of the E counts to the host); moe_permute
// makes src and inv.
struct MoeRouting {
  Tensor idx, src, inv;
  std::vector<std::int64_t> counts;
  std::int64_t topk = 1;
  std::vector<std::int64_t> indices() const;  // idx on the host, as integers
  std::vector<std::int64_t> sources() const;  // src on the host, as integers
  // The first row of each expert in the expert-sorted order (exclusive prefix sums of counts).
  std::vector<std::int64_t> offsets() const {
    std::vector<std::int64_t> off(counts.size(), 0);
    for (std::size_t e = 1; e < counts.size(); ++e) off[e] = off[e - 1] + counts[e - 1];
    return off;
  }
};
// A routing from given expert indices [T*k] (each in [0, experts)), its idx in space `sp`.
MoeRouting moe_routing(const std::vector<std::int64_t>& topk_idx, std::int64_t topk, std::int64_t experts, Space sp);
// logits [T,E] -> scores [T,E], selection by scores + correction_bias [E] (optional, selection only),
// route.idx and route.counts (ties to the lower index), topk_w [T,k].
void router_fwd(Tensor& scores, MoeRouting& route, Tensor& topk_w, const Tensor& logits, const Tensor* correction_bias,
                const RouterParams& p);
// dlogits [T,E] from dtopk_w [T,k] and optionally dscores [T,E] (e.g. from the aux loss).
void router_bwd(Tensor& dlogits, const Tensor& scores, const MoeRouting& route, const Tensor& dtopk_w,
                const Tensor* dscores, const RouterParams& p);
// Switch-style load-balancing loss E * sum_e f_e P_e, f_e = share of assignments to e (route.counts),
// P_e = mean over tokens of the normalised score. Backward adds d/dscores (scaled by dloss) into dscores.
double moe_aux_loss_fwd(const Tensor& scores, const MoeRouting& route, const RouterParams& p);
void moe_aux_loss_bwd(Tensor& dscores, const Tensor& scores, const MoeRouting& route, const RouterParams& p,
                      double dloss);
// Permute token copies by expert: makes route.src and route.inv; xp [T*k,C] row r = x row src[r] / k.
void moe_permute(Tensor& xp, MoeRouting& route, const Tensor& x);
// dx [T,C] = sum of dxp rows of each token.
void moe_permute_bwd(Tensor& dx, const Tensor& dxp, const MoeRouting& route);
// y [T,C] = sum_slots topk_w * yp row of that slot.
void moe_combine_fwd(Tensor& y, const Tensor& yp, const MoeRouting& route, const Tensor& topk_w);
void moe_combine_bwd(Tensor& dyp, Tensor& dtopk_w, const Tensor& dy, const Tensor& yp, const MoeRouting& route,
                     const Tensor& topk_w);
enum class Activation { SquaredReLU, SwiGLU };
// The rows of an MLP's first projection (F1) for a hidden width F: SwiGLU's gate and up rows, 2F.
inline std::int64_t first_projection_rows(Activation act, std::int64_t ffn) {
  return act == Activation::SwiGLU ? 2 * ffn : ffn;
}
// Grouped expert MLP over permuted rows: rows of expert e are consecutive (counts). W1 [E,F1,C]
// (F1 = F, or 2F for SwiGLU: gate rows then up rows), W2 [E,C,F]. h [T*k,F1] saved for backward.
void expert_mlp_fwd(Tensor& yp, Tensor& h, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const std::vector<std::int64_t>& counts, Activation act);
// dxp may be dyp itself: dyp is read in full before dxp is written.
void expert_mlp_bwd(Tensor& dxp, Tensor& dW1, Tensor& dW2, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const Tensor& h, const std::vector<std::int64_t>& counts, Activation act, const Tensor& dyp);

}  // namespace hcp::kernels
