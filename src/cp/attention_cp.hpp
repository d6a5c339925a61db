// Context-parallel attention over a CP group: ring p2p with DualChunkSwap, all-gather of K/V,
// Ulysses head all-to-all, and Ulysses over an inner group around a ring over the outer group
// (a2a+p2p); forward and backward; BSHD and THD (packed) alike.
// Contract: q, dout local [Tl, H, D]; k, v local [Tl, Hkv, D]; Tl = global tokens / cp, tokens in
// DCS order (cp/layout.hpp) of the global, padded layout (every sequence a multiple of 2*cp); or,
// with a per-document placement, Tl = placement.local_rows(rank) in its order (cp/placement.hpp).
#pragma once
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/process_grid.hpp"
#include "core/seq_layout.hpp"
#include "cp/documents.hpp"
#include "cp/placement.hpp"
#include "cp/strategy.hpp"
#include "kernels/kernels.hpp"

namespace hcp::cp {

struct CpAttnConfig {
  AttnStrategy strategy = AttnStrategy::P2P;
  std::int64_t heads = 1, kv_heads = 1, head_dim = 1;
  bool causal = true;
  double scale = 0;  // 0: 1/sqrt(head_dim)
  // Where the rows lie on the CP group: DualChunkSwap of placement.global (BSHD rows or THD packed
  // sequences, padded; placement.cp the group's size), or per document: placement.global is then the
  // unpadded packed documents, a rank's rows are its whole documents (attended locally, nothing sent)
  // followed by its chunks of the split documents, which `strategy` runs over each block of ranks
  // they are split on (placement.cp_parts, part_config).
  Placement placement;
  // a2a+p2p: ranks of the inner (Ulysses) group, consecutive ranks; divides the CP size. The outer
  // ring runs over the cp / cp_inner ranks with the same inner index.
  int cp_inner = 1;
};

// One CP part of cfg's placement (Placement::cp_parts) as a problem of its own: cfg on the part's
// DualChunkSwap placement over its block of g ranks; a2a+p2p's inner group is gcd(cp_inner, g).
CpAttnConfig part_config(const CpAttnConfig& cfg, const CpPart& part);

// Time split of the last forward/backward (seconds, this rank).
struct CpAttnTimes {
  double compute = 0, comm_wait = 0;
};

// The shape rules of cfg.strategy on a CP group of `cp` ranks (CpAttention's constructor applies
// them): throws hcp::Error naming the deck keys and the rule.
void check_attention_cp_shape(const CpAttnConfig& cfg, int cp);

// Bytes rank `rank` of a CP group of `cp` ranks hands to the communicator in one forward (or
// backward) of strategy cfg.strategy, from the sizes alone (no communicator; the planner and
// --dry-run read it without the ranks). Logical payload, not wire bytes. The layout must split
// (every sequence a multiple of 2*cp), and the strategy's shape rules hold.
std::int64_t attention_cp_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward);

// a2a+p2p: the p2p ring over the outer group that rank `rank` joins (its heads / cp_inner query
// heads and the K/V heads they read, on the outer group's DCS layout), and the bytes that ring sends
// (the part of attention_cp_model_bytes that crosses nodes).
CpAttnConfig a2a_p2p_ring_config(const CpAttnConfig& cfg, int rank);
std::int64_t a2a_p2p_ring_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward);

// a2a+p2p: the most K/V heads a rank carries around the outer ring (its query heads' K/V heads, or
// one per query head where its block does not follow the GQA groups), for `inner` ranks inside.
std::int64_t a2a_p2p_ring_kv_heads(std::int64_t heads, std::int64_t kv_heads, int inner);

// One attention layer's CP on this rank: the problem and the saved tensors (AttnStep) and the
// strategy object that runs it (its record's make; the local kernels at cp = 1; whole and split
// documents for a per-document placement). CpAttention holds no strategy's state.
class CpAttention {
 public:
  // Validates shapes against the CP size (clear errors naming the rule); collective-free. a2a+p2p
  // runs over `levels` when given (built with cfg.cp_inner over cp_comm), else over levels it
  // builds at its first forward.
  CpAttention(Communicator& cp_comm, CpAttnConfig cfg, std::shared_ptr<CpLevels> levels = nullptr);
  ~CpAttention();
  CpAttention(const CpAttention&) = delete;
  CpAttention& operator=(const CpAttention&) = delete;
  void forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v);
  // Needs the forward's saved tensors (of the same instance); releases them.
  void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout);
  // Drops the forward's saved tensors when no backward follows (a prefill).
  void release();
  // Device time on GPU ranks (CUDA events), wall time on host ranks (PhaseTimes).
  CpAttnTimes fwd_times() const;
  CpAttnTimes bwd_times() const;
  // Values this rank sends per forward / backward, by the strategy's cost model
  // (attention_cp_model_bytes).
  std::int64_t model_fwd_bytes(DType dt) const;
  std::int64_t model_bwd_bytes(DType dt) const;
  // a2a+p2p's groups (null before they are made)
  const CpLevels* levels() const;

 private:
  std::unique_ptr<AttnStep> s_;
  std::unique_ptr<AttnImpl> impl_;
};

}  // namespace hcp::cp
