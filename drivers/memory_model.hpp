// Memory per rank: one model of the tensor bytes a rank of each driver and strategy holds, from the
// deck alone. The drivers' admission check (validate phase, before anything is allocated), their
// --dry-run and the planner (hcp_plan.py, which runs --dry-run) all read it.
//
// What a rank holds is split into parts. Parts of every rank: the driver's inputs and outputs, the
// parameters and their gradients, the activations its blocks keep for the backward, the largest
// block's step-time buffers (K/V blocks in flight, gathered K/V, all-to-all buffers, accumulators)
// — all of its own tokens (global / cp). Parts of a run with run.check = "reference": the cp=1
// problem on rank 0 (the whole sequence: its step, then the results it keeps for the comparisons)
// and the global copy of one result every rank gathers to compare. The per-token counts are written
// from the tensors the layers allocate (named beside each term) and rounded up; they are checked
// against the measured tensor high-water of every driver and strategy at several rank counts
// (tests/drivers: estimate / measured in [1.0, 1.5]).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "harness.hpp"
#include "io/deck.hpp"
#include "model/hybrid.hpp"
#include "model/mamba2.hpp"

namespace hcp::drivers {

// Where a part lives: on every rank; on rank 0 while the CP cases run (kept reference results); on
// rank 0 before them (the reference's own step, freed before the CP cases begin).
enum class Holder { EveryRank, Rank0Kept, Rank0Before };

struct MemoryPart {
  std::string name;
  Holder holder = Holder::EveryRank;
  std::int64_t bytes = 0;
};

class MemoryModel {
 public:
  // `keys`: the deck keys the sizes come from (named when a product overflows or a part does not fit).
  explicit MemoryModel(std::string keys) : keys_(std::move(keys)) {}
  // Adds to part `name` the product of `factors` times `bytes_per` (refused when it overflows 64 bits).
  MemoryModel& add(const std::string& name, std::initializer_list<std::int64_t> factors, std::int64_t bytes_per = 1,
                   Holder h = Holder::EveryRank) {
    std::int64_t v = bytes_per;
    for (std::int64_t f : factors) v = mul(v, f);
    for (MemoryPart& p : parts_)
      if (p.name == name && p.holder == h) {
        p.bytes = sum(p.bytes, v);
        return *this;
      }
    parts_.push_back({name, h, v});
    return *this;
  }
  std::int64_t mul(std::int64_t a, std::int64_t b) const {
    std::int64_t r = 0;
    HCP_INPUT_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r), keys_, overflow());
    return r;
  }
  std::int64_t sum(std::int64_t a, std::int64_t b) const {
    HCP_INPUT_CHECK(a <= std::numeric_limits<std::int64_t>::max() - b, keys_, overflow());
    return a + b;
  }
  // Closes the model: 2 % of every part for the small tensors the terms leave out (index lists, LSE
  // rows, per-head vectors) and the allocator's rounding.
  MemoryModel& with_slack() {
    std::vector<MemoryPart> slack;
    for (const MemoryPart& p : parts_) {
      auto it = std::find_if(slack.begin(), slack.end(), [&](const MemoryPart& s) { return s.holder == p.holder; });
      if (it == slack.end()) slack.push_back({"small tensors (2 %)", p.holder, 0}), it = slack.end() - 1;
      it->bytes = sum(it->bytes, p.bytes / 50);
    }
    for (MemoryPart& s : slack) add(s.name, {s.bytes}, 1, s.holder);
    return *this;
  }
  std::int64_t total(Holder h) const {
    std::int64_t t = 0;
    for (const MemoryPart& p : parts_)
      if (p.holder == h) t = sum(t, p.bytes);
    return t;
  }
  // What every rank holds in a CP case.
  std::int64_t every_rank() const { return total(Holder::EveryRank); }
  // Rank 0's high-water: its reference step before the cases, or the kept results beside a case.
  std::int64_t rank0() const {
    return std::max(total(Holder::Rank0Before), sum(total(Holder::Rank0Kept), every_rank()));
  }
  std::int64_t peak() const { return std::max(every_rank(), rank0()); }
  bool reference_held() const { return total(Holder::Rank0Before) + total(Holder::Rank0Kept) > 0; }
  const std::vector<MemoryPart>& parts() const { return parts_; }
  const std::string& keys() const { return keys_; }

 private:
  std::string overflow() const { return "these sizes give a tensor size that overflows 64 bits"; }
  std::string keys_;
  std::vector<MemoryPart> parts_;
};

// ---- shapes ----------------------------------------------------------------------------------------
// Global tokens after padding: batch x seqlen (BSHD) or the lengths padded to 2*cp (THD); and the
// unpadded total (the cp=1 reference's tokens).
std::int64_t padded_tokens(const Deck& d, int cp, const MemoryModel& m);
std::int64_t real_tokens(const Deck& d, const MemoryModel& m);
std::int64_t dtype_bytes(const Deck& d);
// run.check: "reference" (cp=1 on rank 0), "cross" (the strategies against each other, shard by
// shard) or "off".
enum class CheckMode { Reference, Cross, Off };
CheckMode check_mode(const Deck& d);

// One attention layer's step-time bytes per rank beyond its inputs and outputs (strategy p2p,
// allgather, a2a or a2a+p2p with `inner` ranks inside; cp = 1 runs the local kernels whatever the
// strategy), `tl` local tokens.
std::int64_t attention_work_bytes(const MemoryModel& m, const std::string& strategy, int cp, std::int64_t tl,
                                  std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t es,
                                  int inner = 1);
// One Mamba2 mixer's step-time elements per local token (hidden_parallel or state_passing).
std::int64_t mamba_work_per_token(const model::Mamba2Config& c, const std::string& strategy, int cp);
// Hidden parallel: how many copies of each B/C group the ranks hold (cp / n_groups when n_groups < cp).
std::int64_t hp_group_repeat(const model::Mamba2Config& c, int cp);
std::int64_t mamba_param_count(const model::Mamba2Config& c);
// State passing's per-sequence state rows (H (P N + 1) values each, in the scan dtype) per rank for
// `sequences` sequences at cp: saved per Mamba2 layer, and held while one layer runs.
struct StateRows {
  std::int64_t saved = 0, work = 0, row = 0;
};
StateRows state_passing_rows(const model::Mamba2Config& c, int cp, std::int64_t sequences);

// Terms the drivers' models share: bytes of a bf16 sum (fp32), ceil(a / b), sequences of the deck's
// layout, bytes of a state-passing state value (fp32 for bf16), a2a+p2p's K/V heads per rank on the
// outer ring, and whether the host kernels widen bf16 operands into fp32 copies (bf16 on CPU ranks)
// with the elements of the attention kernels' largest call (q, o, dout, dq and the K/V read, with
// their gradients).
constexpr std::int64_t acc_bytes(std::int64_t es) { return es == 2 ? 4 : es; }
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t sequences(const Deck& d);
std::int64_t state_bytes(const Deck& d);
std::int64_t ring_kv_heads(std::int64_t H, std::int64_t Hkv, int inner);
bool host_bf16(const Deck& d);
std::int64_t attention_kernel_elements(const MemoryModel& m, const std::string& strategy, int cp, std::int64_t tl,
                                       std::int64_t H, std::int64_t Hkv, std::int64_t D, int inner = 1);

// ---- the drivers' models -----------------------------------------------------------------------------
MemoryModel attention_memory(const Deck& d, int cp, const std::string& strategy);
MemoryModel mamba_memory(const Deck& d, int cp, const std::string& strategy);
// cp_hybrid: one forward+backward step of the model at EP size ep, each attention layer by its strategy.
MemoryModel hybrid_memory(const Deck& d, const model::HybridConfig& h, int cp, int ep);
// train_hybrid: the step's tokens, master weights, AdamW moments, the replica on rank 0.
MemoryModel train_memory(const Deck& d, const model::HybridConfig& h, int cp, int ep);
// The hybrid stack's activations and step buffers per rank (shared by cp_hybrid and train_hybrid);
// each attention layer's buffers by its own strategy (HybridConfig::attention_layer).
void add_hybrid_step(MemoryModel& m, const model::HybridConfig& h, int cp, int ep, std::int64_t tl, std::int64_t es,
                     Holder holder);

}  // namespace hcp::drivers
