// Decode after a context-parallel prefill: one new token per sequence per step, from what the
// prefill left on each rank, nothing gathered. The new tokens' activations ([B, hidden], a few KiB)
// are the same on every rank; the long-lived state stays sharded:
//   Mamba2     each rank steps the conv windows and SSM states it holds (MambaCarry: hidden
//              parallel, its heads of every sequence; state passing, every head of the sequences
//              whose prompt ends on it) by conv1d_step and ssd_step; the per-head outputs are
//              summed over the group (each (sequence, head) comes from one rank, so the sum is that
//              value exactly), then the gated norm and out_proj run on every rank;
//   attention  each rank attends the new query to its KV shard (the prefill's K/V of its rows plus
//              the new tokens appended to it); the partial outputs and their log-sum-exps are
//              gathered and merged in rank order, so every rank holds the same bits;
//   MoE        the new tokens are split over the ranks, each runs its share through the layer's
//              expert-parallel dispatch, and the outputs are summed over the group (disjoint rows);
//   MLP, norms, embedding and LM head run on every rank.
// The new token's K/V goes to the rank that holds the fewest cached tokens of its sequence, the
// lowest such rank on a tie (every rank applies the rule to the same counts): the shards stay
// balanced as the sequence grows, also when a prompt was short enough to sit on a few ranks.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/phase_times.hpp"
#include "model/hybrid.hpp"

namespace hcp::model {

// One attention layer's KV shard on one rank: per sequence a region of `cap` rows of K and V
// [rows, Hkv, D], the first `count` in use.
struct KvShard {
  Tensor k, v;
  std::vector<std::int64_t> base, count, cap;  // per sequence
  std::int64_t bytes() const;
};

class HybridDecoder {
 public:
  // `prefilled`: a model whose last forward ran with keep_handoff(true) on the prompts (its
  // placement's sequences, at their real lengths). `new_tokens`: the most tokens any sequence will
  // be given (the KV regions' room). Takes the hand-off from the model's layers; collective-free.
  HybridDecoder(HybridModel& prefilled, std::int64_t new_tokens);
  // One token per sequence, `ids` [nseq] (the same on every rank): appends it and returns the
  // logits of the next token, [nseq, V] (the same bits on every rank). Collective over the CP group.
  Tensor step(const ParamMap& p, const std::vector<std::int64_t>& ids);
  std::int64_t sequences() const { return nseq_; }
  // Tokens of sequence s so far (prompt + appended).
  std::int64_t length(std::int64_t s) const { return len_[static_cast<std::size_t>(s)]; }
  // The rank that holds sequence s's `n`-th cached token of attention (n >= its prompt length: the
  // append rule's choice; every rank knows it).
  int kv_owner(std::int64_t s) const;
  // Bytes this rank holds of the hand-off: the Mamba2 windows and states, and the attention KV
  // shards at their allocated size (prompt rows and the room for the new tokens).
  std::int64_t mamba_bytes() const;
  std::int64_t kv_bytes() const;
  // Cached tokens of attention each rank holds (the same numbers on every rank), summed over sequences.
  std::vector<std::int64_t> kv_rows_per_rank() const;
  const std::map<std::string, double>& phase_ms() const { return phases_.totals(); }
  void reset_phases() { phases_.reset(); }

 private:
  struct Layer {
    char kind;
    std::string prefix;
    MambaCarry carry;  // 'M'
    KvShard kv;        // '*'
    AttnLayerConfig attn;
  };
  void mamba_step(Tensor& y, const Tensor& x, const ParamMap& p, MambaCarry& c);
  void attention_step(Tensor& y, const Tensor& x, const ParamMap& p, Layer& l, const std::vector<int>& owner);
  void moe_step(Tensor& y, const Tensor& x, const ParamMap& p, MoeLayer& moe);
  template <class F>
  void timed(const std::string& name, F&& f);
  HybridModel& m_;
  Communicator& comm_;
  std::int64_t nseq_ = 0;
  std::vector<std::int64_t> len_;                // tokens per sequence so far
  std::vector<std::vector<std::int64_t>> kv_n_;  // [rank][seq] cached attention tokens
  std::vector<Layer> layers_;
  PhaseTimes phases_;
};

}  // namespace hcp::model
