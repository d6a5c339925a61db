// The non-Mamba mixers of the hybrid stack, forward and backward on local tokens of a CP rank:
//   AttentionLayer  QKV projections -> optional RoPE at global positions -> CP attention (ring p2p,
//                   all-gather or Ulysses a2a) -> output projection;
//   MoeLayer        router (sigmoid / softmax, correction bias for selection only, top-k, renorm,
//                   scaling) -> permute -> expert-parallel dispatch -> grouped expert MLP -> combine
//                   -> + shared expert; each rank holds only its EP rank's experts (W1, W2);
//   MlpLayer        dense MLP (squared ReLU or SwiGLU).
// Every layer sums its parameter gradients over the CP group (`grad_comm`) so each rank holds the
// full gradient, as Mamba2Layer does; the expert weights' gradients are summed over the ranks that
// hold the same experts.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/seq_layout.hpp"
#include "cp/attention_cp.hpp"
#include "cp/moe_ep.hpp"
#include "cp/placement.hpp"
#include "kernels/kernels.hpp"
#include "model/mamba2.hpp"

namespace hcp::model {

// Uniform(-a, a) parameters with a per-name seed (shared by every layer's init).
void init_param(ParamMap& p, const std::string& name, const Shape& s, DType dt, std::uint64_t seed, double lo,
                double hi);
// The rows `r` of what init_param(whole) makes, bit for bit, without making the rest.
void init_param_rows(ParamMap& p, const std::string& name, const Shape& whole, RowRange r, DType dt, std::uint64_t seed,
                     double lo, double hi);
// Sums a parameter gradient over `c` in place. A bf16 gradient is summed in fp32 and rounded once:
// each rank's part is already rounded, and a bf16 sum would round again at every step of the
// reduction, which a cancelling sum (parts of opposite sign) turns into a large relative error.
void reduce_grad(Communicator& c, Tensor& g);

struct AttnLayerConfig {
  std::int64_t hidden = 64, heads = 4, kv_heads = 2, head_dim = 16;
  bool causal = true;
  double rope_theta = 0;  // 0: no positional embedding (NemotronH/V3)
  cp::AttnStrategy strategy = cp::AttnStrategy::P2P;
  int cp_inner = 1;  // a2a+p2p: the inner group's ranks
};
// The CP attention of a layer of config `c` on the batch placed by `placement`.
cp::CpAttnConfig cp_attn_config(const AttnLayerConfig& c, const cp::Placement& placement);
std::vector<ParamSpec> attention_params(const AttnLayerConfig& c);  // Wq, Wk, Wv, Wo
ParamMap attention_init(const AttnLayerConfig& c, DType dt, std::uint64_t seed);

class AttentionLayer {
 public:
  // `levels`: a2a+p2p's groups, when the model shares them between its layers (CpLevels).
  AttentionLayer(Communicator& cp_comm, AttnLayerConfig cfg, const cp::Placement& placement,
                 std::shared_ptr<CpLevels> levels = nullptr);
  void forward(Tensor& y, const Tensor& x, const ParamMap& p);
  void backward(Tensor& dx, ParamMap& grads, const Tensor& dy, const ParamMap& p);
  // Drops what the forward kept for a backward (a prefill: none follows); keep_kv's shard stays.
  void drop_saved() {
    attn_.release();
    x_ = o_ = Tensor();
  }
  const cp::CpAttention& attention() const { return attn_; }
  // With `on`, the next forward keeps this rank's K and V (after RoPE), [Tl, Hkv, D] in its local
  // row order: the prefill's KV cache shard, where the projections computed it. Off: drops them.
  void keep_kv(bool on) {
    keep_kv_ = on;
    if (!on) k_ = v_ = Tensor();
  }
  const Tensor& k_local() const { return k_; }
  const Tensor& v_local() const { return v_; }
  const AttnLayerConfig& config() const { return c_; }

 private:
  Communicator& comm_;
  AttnLayerConfig c_;
  cp::CpAttention attn_;
  std::vector<std::int64_t> pos_;
  std::int64_t tl_ = 0;
  Tensor x_, o_;
  bool keep_kv_ = false;
  Tensor k_, v_;
};

struct MlpConfig {
  std::int64_t hidden = 64, ffn = 128;
  kernels::Activation act = kernels::Activation::SquaredReLU;
};
std::vector<ParamSpec> mlp_params(const MlpConfig& c);  // W1 [F1,C], W2 [C,F]
ParamMap mlp_init(const MlpConfig& c, DType dt, std::uint64_t seed);

class MlpLayer {
 public:
  MlpLayer(Communicator& grad_comm, MlpConfig cfg) : comm_(grad_comm), c_(cfg) {}
  void forward(Tensor& y, const Tensor& x, const ParamMap& p);
  void backward(Tensor& dx, ParamMap& grads, const Tensor& dy, const ParamMap& p);
  void drop_saved() { x_ = h_ = Tensor(); }  // what the forward kept for a backward

 private:
  Communicator& comm_;
  MlpConfig c_;
  Tensor x_, h_;
};

struct MoeConfig {
  std::int64_t hidden = 64, experts = 8, topk = 2, ffn = 32, shared_ffn = 0;  // shared_ffn 0: none
  kernels::RouterParams router() const;
  bool sigmoid = true, renormalize = true;
  double scaling = 1.0;
  kernels::Activation act = kernels::Activation::SquaredReLU;
};
// router [E,C], e_bias [E] (selection-only correction bias: a buffer, its gradient is zero),
// W1 [E,F1,C], W2 [E,C,F], and shared_W1 [F1s,C], shared_W2 [C,Fs] when shared_ffn > 0.
// `experts`: the experts a rank holds (W1, W2 get rows [first, first + rows) of the E axis).
std::vector<ParamSpec> moe_params(const MoeConfig& c);
ParamMap moe_init(const MoeConfig& c, DType dt, std::uint64_t seed, RowRange experts = {});
// The names of the expert weights (split over EP ranks along their first axis).
bool is_expert_weight(const std::string& moe_param_name);

class MoeLayer {
 public:
  // ep_comm: the expert-parallel group (the CP group, part of it, or one rank for no EP); EP rank q
  // holds experts [q E/ep, (q+1) E/ep): W1 and W2 passed to forward/backward are that part only.
  // replica_comm: the ranks holding the same experts (their W1/W2 gradients are summed over it);
  // grad_comm: the group over which the router and shared-expert gradients are summed (the CP group).
  MoeLayer(Communicator& ep_comm, Communicator& replica_comm, Communicator& grad_comm, MoeConfig cfg);
  void forward(Tensor& y, const Tensor& x, const ParamMap& p);
  void backward(Tensor& dx, ParamMap& grads, const Tensor& dy, const ParamMap& p);
  // Drops what the forward kept for a backward (a prefill); the selection stays.
  void drop_saved();
  // Token copies each local expert received in the last forward.
  const std::vector<std::int64_t>& local_counts() const { return local_counts_; }
  // The experts each local token chose in the last forward, [T * topk] (F64 integers, in the run's
  // memory space).
  const Tensor& selection() const { return route_.idx; }
  std::int64_t topk() const { return c_.topk; }

 private:
  Communicator &ep_, &replica_, &grad_;
  MoeConfig c_;
  std::unique_ptr<cp::EpDispatcher> disp_;
  std::unique_ptr<MlpLayer> shared_;
  Tensor x_, scores_, topk_w_, xl_, h_, yp_;
  kernels::MoeRouting route_;  // of the last forward; its permutation is dropped after the backward
  std::vector<std::int64_t> local_counts_;
};

}  // namespace hcp::model
