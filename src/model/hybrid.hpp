// The hybrid NemotronV3 / Nemotron-H style language model under context parallelism: a block
// stack from a pattern string ('M' Mamba2, '*' attention, 'E' MoE, '-' dense MLP), each block
// pre-norm (RMSNorm) with a residual, then final RMSNorm, LM head and cross-entropy over the label
// tokens with the global label count all-reduced over the CP group. Tokens stay in the
// DualChunkSwap layout between blocks; each mixer converts inside itself. Forward and backward are
// written out; every parameter gradient is summed over the CP group, except the routed experts':
// a rank holds only its expert-parallel rank's experts (ExpertGroups), and their gradients are
// summed over the ranks that hold the same experts.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_grid.hpp"
#include "core/phase_times.hpp"
#include "cp/placement.hpp"
#include "model/layers.hpp"
#include "model/mamba2.hpp"

namespace hcp::model {

struct HybridConfig {
  std::string pattern = "M*E-";
  std::int64_t vocab = 64, hidden = 32;
  double eps = 1e-5;
  Mamba2Config mamba;
  MambaCp mamba_cp = MambaCp::HiddenParallel;
  AttnLayerConfig attn;
  // The CP strategy of each attention block, in pattern order (parallel.attention as a list); empty:
  // attn.strategy for every one.
  std::vector<cp::AttnStrategy> attn_layers;
  MoeConfig moe;
  MlpConfig mlp;
  // Expert-parallel group size: the CP group splits into groups of `ep` consecutive ranks, and EP rank
  // q of each holds experts [q E/ep, (q+1) E/ep). 0: the whole CP group; 1: every rank holds all.
  int ep = 0;
  std::int64_t ignore_label = -100;
  // Sizes of the sub-configs follow `hidden`; throws on an unknown pattern character or an
  // attn_layers list whose length is not the number of attention blocks.
  void finalize();
  // The attention config of the j-th attention block (its strategy from attn_layers).
  AttnLayerConfig attention_layer(std::size_t j) const;
};

// The experts rank groups.rank() of its expert-parallel group holds: rows of the E axis of W1 / W2.
RowRange local_experts(const ExpertGroups& groups, std::int64_t total);

// A split parameter: this rank holds rows [first, first + rows) of a [total, ...] tensor.
struct Shard {
  std::int64_t first = 0, rows = 0, total = 0;
};
using ShardMap = std::map<std::string, Shard>;  // only the split parameters, by full name

// Parameter names: embed [V,C], final_norm [C], lm_head [V,C], and per block i "L<i>.norm" [C] plus
// the mixer's parameters as "L<i>.<name>". With `groups`, the routed experts' W1 / W2 are this
// rank's rows only (bit for bit the rows of the whole init); without, whole.
ParamMap hybrid_init(const HybridConfig& c, DType dt, std::uint64_t seed, const ExpertGroups* groups = nullptr);
// The names hybrid_init gives, without making any tensor.
std::vector<std::string> hybrid_param_names(const HybridConfig& c);
// The parameters `groups` splits, and this rank's part of each.
ShardMap expert_shards(const HybridConfig& c, const ExpertGroups& groups);
// Elements of the parameters one rank holds: all of them, and of those the routed experts'.
struct ParamCount {
  std::int64_t total = 0, experts = 0;
};
ParamCount param_count(const HybridConfig& c, int ep);
// The parameters of the block whose names start with `prefix` ("L03."), without it; its norm's
// weight left out.
ParamMap block_params(const ParamMap& p, const std::string& prefix);
// Names that are buffers, not trained (the MoE selection bias).
bool is_buffer(const std::string& name);

struct StepResult {
  double loss = 0;                // mean over the global label tokens
  std::int64_t label_tokens = 0;  // global
};

// The work of the hybrid step per document, in multiply-adds (the per-document placement's cost
// model): per (query, key) pair of each attention block (Q K^T and P V) and per token of every
// block's projections and MLPs.
cp::DocCost hybrid_doc_cost(const HybridConfig& h);

class HybridModel {
 public:
  // `groups`: the expert-parallel layout of cp_comm (parameters then follow expert_shards); without,
  // the model builds its own from cfg.ep (collective).
  // `placement`: the batch's rows over cp_comm (DualChunkSwap of its layout, or per document; the
  // tokens a rank's rows in the placement's order).
  HybridModel(Communicator& cp_comm, HybridConfig cfg, const cp::Placement& placement,
              const ExpertGroups* groups = nullptr);
  // DualChunkSwap of `global` over cp_comm.
  HybridModel(Communicator& cp_comm, HybridConfig cfg, SeqLayout global, const ExpertGroups* groups = nullptr);
  // tokens/labels: this rank's local tokens (DCS order). Forward and backward; grads overwritten.
  StepResult step(const ParamMap& p, const std::vector<std::int64_t>& tokens, const std::vector<std::int64_t>& labels,
                  ParamMap& grads);
  // Forward only (the loss), as a prefill runs it: each block drops what it kept for a backward
  // once it has run (keep_handoff's K/V shards and Mamba2 carries stay), so the rank holds one
  // block's work at a time; block_outputs() is empty after it and backward is not possible.
  StepResult forward(const ParamMap& p, const std::vector<std::int64_t>& tokens,
                     const std::vector<std::int64_t>& labels);
  // After step(): local output of every block [Tl, C], logits and their gradient [Tl, V].
  const std::vector<Tensor>& block_outputs() const { return outs_; }
  const Tensor& logits() const { return logits_; }
  const Tensor& dlogits() const { return dlogits_; }
  // After a forward: per MoE block (in pattern order), the experts each local token chose, as a
  // host fp64 tensor [Tl, topk] (DCS order, like the block outputs).
  std::vector<Tensor> routing() const;
  // Milliseconds per phase, summed since reset: fwd/<kind>, bwd/<kind> (kind: embed, M, *, E, -, head);
  // on GPU ranks each phase's own device time (CUDA events, core/phase_times.hpp).
  const std::map<std::string, double>& phase_ms() const { return phases_.totals(); }
  const std::map<std::string, PhaseTimes::Peak>& phase_peaks() const { return phases_.peaks(); }
  void reset_phases() { phases_.reset(); }
  // After a forward: the bytes this rank handed to the communicator (and its sub-groups) in each kind
  // of block (M, *, E, -), that forward only.
  const std::map<char, std::int64_t>& forward_bytes() const { return fwd_bytes_; }
  const HybridConfig& config() const { return c_; }
  // The j-th attention layer of the pattern.
  const AttentionLayer& attention(std::size_t j) const;
  // With `on`, the next forward is a prefill: every Mamba2 layer makes its decode hand-off and every
  // attention layer keeps its K/V shard (HybridDecoder takes them). DualChunkSwap placements only.
  void keep_handoff(bool on);
  // After a forward: the logits at each sequence's last real token, [nseq, V] on every rank (the
  // rank holding the token contributes it; collective).
  Tensor last_logits();
  const cp::Placement& placement() const { return placement_; }

 private:
  friend class HybridDecoder;
  struct Block {
    char kind;
    std::string prefix;
    std::unique_ptr<Mamba2Layer> mamba;
    std::unique_ptr<AttentionLayer> attn;
    std::unique_ptr<MoeLayer> moe;
    std::unique_ptr<MlpLayer> mlp;
    Tensor x, rstd;  // block input and its norm's rstd (saved)
  };
  // `keep`: save what the backward reads (step), else drop it block by block (forward).
  void fwd(const ParamMap& p, const std::vector<std::int64_t>& tokens, const std::vector<std::int64_t>& labels,
           StepResult& r, bool keep);
  static void drop_saved(Block& b);  // what the block's forward kept for a backward
  template <class F>
  void timed(const std::string& name, F&& f);
  Communicator& comm_;
  std::unique_ptr<ExpertGroups> own_groups_;
  const ExpertGroups* groups_ = nullptr;
  HybridConfig c_;
  cp::Placement placement_;
  std::int64_t tl_ = 0;
  std::vector<Block> blocks_;
  // a2a+p2p's inner and outer groups by inner size, shared by the attention layers that use them
  std::map<int, std::shared_ptr<CpLevels>> levels_;
  std::vector<Tensor> outs_;
  Tensor hfinal_, rstd_final_, hn_, logits_, dlogits_;
  std::vector<std::int64_t> tokens_, labels_;
  std::int64_t count_ = 0;
  PhaseTimes phases_;
  std::map<char, std::int64_t> fwd_bytes_;
};

}  // namespace hcp::model
