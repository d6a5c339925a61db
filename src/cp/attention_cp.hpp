// Context-parallel attention over a CP group: ring p2p with DualChunkSwap, all-gather of K/V,
// Ulysses head all-to-all, and Ulysses over an inner group around a ring over the outer group
// (a2a+p2p); forward and backward; BSHD and THD (packed) alike.
// Contract: q, dout local [Tl, H, D]; k, v local [Tl, Hkv, D]; Tl = global tokens / cp, tokens in
// DCS order (cp/layout.hpp) of the global, padded layout (every sequence a multiple of 2*cp); or,
// with a per-document placement (CpAttnConfig::docs), Tl = docs->local_rows(rank) in its order.
#pragma once
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/process_grid.hpp"
#include "core/layout.hpp"
#include "core/phase_times.hpp"
#include "cp/documents.hpp"
#include "cp/head_exchange.hpp"
#include "cp/strategy.hpp"
#include "kernels/kernels.hpp"

namespace hcp::cp {

struct CpAttnConfig {
  AttnStrategy strategy = AttnStrategy::P2P;
  std::int64_t heads = 1, kv_heads = 1, head_dim = 1;
  bool causal = true;
  double scale = 0;  // 0: 1/sqrt(head_dim)
  SeqLayout global;  // BSHD rows or THD packed sequences, padded
  // a2a+p2p: ranks of the inner (Ulysses) group, consecutive ranks; divides the CP size. The outer
  // ring runs over the cp / cp_inner ranks with the same inner index.
  int cp_inner = 1;
  // data.partition = documents (cp/documents.hpp): `global` is then the unpadded packed documents,
  // a rank's rows are its whole documents (attended locally, nothing sent) followed by its chunks of
  // the split documents, which `strategy` runs over the CP group as the layout docs->split.
  std::shared_ptr<const DocPartition> docs;
};

// The split documents of a per-document layout as a CP problem of their own: cfg with global =
// docs->split and no per-document placement.
CpAttnConfig split_documents_config(const CpAttnConfig& cfg);

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

// The strategies' parts their records (cp/strategy.hpp) name: shape rules and byte models.
void check_a2a_shape(const CpAttnConfig& cfg, int cp);
void check_a2a_p2p_shape(const CpAttnConfig& cfg, int cp);
std::int64_t p2p_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward);
std::int64_t allgather_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward);
std::int64_t a2a_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward);
std::int64_t a2a_p2p_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward);
// ... and memory terms (AttnStrategyInfo::work_bytes, kernel_elements).
std::int64_t p2p_work_bytes(const MemoryModel& m, const AttnMemShape& s);
std::int64_t allgather_work_bytes(const MemoryModel& m, const AttnMemShape& s);
std::int64_t a2a_work_bytes(const MemoryModel& m, const AttnMemShape& s);
std::int64_t a2a_p2p_work_bytes(const MemoryModel& m, const AttnMemShape& s);
std::int64_t p2p_kernel_elements(const MemoryModel& m, const AttnMemShape& s);
std::int64_t allgather_kernel_elements(const MemoryModel& m, const AttnMemShape& s);
std::int64_t a2a_kernel_elements(const MemoryModel& m, const AttnMemShape& s);
std::int64_t a2a_p2p_kernel_elements(const MemoryModel& m, const AttnMemShape& s);
// a2a+p2p: the most K/V heads a rank carries around the outer ring (its query heads' K/V heads, or
// one per query head where its block does not follow the GQA groups), for `inner` ranks inside.
std::int64_t a2a_p2p_ring_kv_heads(std::int64_t heads, std::int64_t kv_heads, int inner);

class CpAttention {
 public:
  // Validates shapes against the CP size (clear errors naming the rule); collective-free. a2a+p2p
  // runs over `levels` when given (built with cfg.cp_inner over cp_comm), else over levels it
  // builds at its first forward.
  CpAttention(Communicator& cp_comm, CpAttnConfig cfg, std::shared_ptr<CpLevels> levels = nullptr);
  void forward(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v);
  // Needs the forward's saved tensors (of the same instance); releases them.
  void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout);
  // Device time on GPU ranks (CUDA events), wall time on host ranks (PhaseTimes).
  CpAttnTimes fwd_times() const;
  CpAttnTimes bwd_times() const;
  // Values this rank sends per forward / backward, by the strategy's cost model
  // (attention_cp_model_bytes).
  std::int64_t model_fwd_bytes(DType dt) const;
  // a2a+p2p's groups (null before they are made)
  const CpLevels* levels() const { return split_ ? split_->levels() : levels_.get(); }
  std::int64_t model_bwd_bytes(DType dt) const;

 private:
  friend const std::vector<AttnStrategyInfo>& attn_strategies();  // the records name the bodies below
  void fwd_local(Tensor& o);
  void bwd_local(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout);
  void fwd_p2p(Tensor& o);
  void bwd_p2p(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout);
  void fwd_allgather(Tensor& o);
  void bwd_allgather(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout);
  void init_a2a();
  void fwd_a2a(Tensor& o);
  void bwd_a2a(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout);
  void init_a2a_p2p();
  void fwd_a2a_p2p(Tensor& o);
  void bwd_a2a_p2p(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout);
  void fwd_docs(Tensor& o);
  void bwd_docs(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout);
  void make_levels();                  // a2a+p2p: the inner and outer groups, exchanges and ring (collective, once)
  std::int64_t ring_kv_heads() const;  // a2a+p2p: K/V heads per rank on the outer ring
  kernels::AttnParams base_params(std::int64_t heads, std::int64_t kv_heads) const;
  // Ring p2p pieces shared by forward and backward: the [2, Tl, Hkv, D] K-then-V buffer that
  // travels, the attention parameters of step i, and posting the send/receive of the next block.
  Tensor ring_kv_buffer() const;
  Tensor ring_half(const Tensor& buf, int j) const;  // K (j = 0) or V (1) of such a buffer, [Tl, Hkv, D]
  kernels::AttnParams ring_params(int step) const;
  RingRequest ring_post_next(Tensor& send, Tensor& recv, int step, int tag = 7);

  Communicator& comm_;
  CpAttnConfig cfg_;
  int cp_ = 1, rank_ = 0;
  SeqLayout local_;
  std::int64_t tl_ = 0;
  // saved by forward
  Tensor q_, k_, v_, o_, lse_;
  Tensor kg_, vg_;            // all-gather: global K/V
  Tensor qh_, kh_, vh_, oh_;  // a2a: head-sharded, global order
  // a2a: rank r's query heads [r H/cp, (r+1) H/cp) read K/V heads [kv_lo_[r], kv_lo_[r] + kv_n_[r]);
  // exactly those travel. kv_map_ (empty when the local heads are plain GQA): the local K/V head of
  // each local query head, the received heads expanded to one per query head for the kernel.
  // xkv_ moves them: local [Tl, Hkv, D] -> [T, n_mine, D] in global order, and back, the gradients
  // of a K/V head that several ranks read summed at its owner.
  std::vector<std::int64_t> kv_lo_, kv_n_, kv_map_;
  // a2a+p2p: kv_lo_/kv_n_/kv_map_ and xkv_ are over the inner group, xq_ moves the query heads over
  // it, and the p2p ring runs over the outer group on the head-sharded tensors.
  int inner_ = 1, outer_ = 1;
  std::shared_ptr<CpLevels> levels_;
  std::unique_ptr<HeadExchange> xq_, xkv_;
  std::unique_ptr<CpAttention> ring_;
  // per-document placement: the split documents' own CP attention over rows [Tl - S, Tl) (null when
  // none is split); local_ is then the layout of this rank's whole documents, rows [0, Tl - S).
  std::unique_ptr<CpAttention> split_;
  PhaseTimes fwd_ph_, bwd_ph_;  // "compute" and "comm_wait" laps of the last pass
};

}  // namespace hcp::cp
