// What the attention CP strategies (cp/attention_<name>.cpp) share: the step every strategy object
// reads and writes (the problem, this rank's rows, the saved inputs and outputs, the laps), the
// interface of a strategy object, the records each strategy file defines, and small pieces.
// Private to src/cp.
#pragma once
#include <memory>
#include <vector>

#include "core/phase_times.hpp"
#include "core/tensor.hpp"
#include "cp/attention_cp.hpp"
#include "kernels/kernels.hpp"

namespace hcp::cp {

// One CpAttention's step on this rank. A strategy object holds a reference to it.
struct AttnStep {
  AttnStep(Communicator& c, CpAttnConfig f) : comm(c), cfg(std::move(f)), cp(c.size()), rank(c.rank()) {}
  Communicator& comm;
  CpAttnConfig cfg;
  int cp = 1, rank = 0;
  SeqLayout local;  // this rank's rows: DCS order of cfg.placement.global, or (cfg.placement.docs) its whole documents
  std::int64_t tl = 0;  // this rank's rows, all of them (with cfg.placement.docs: whole documents, then split chunks)
  Tensor q, k, v, o, lse;     // saved by forward: [tl, H, D], [tl, Hkv, D] twice, the output, the LSE
  PhaseTimes fwd_ph, bwd_ph;  // "compute" and "comm_wait" laps of the last pass
  // The kernels' parameters for `heads` query and `kv_heads` K/V heads of cfg (no segments).
  kernels::AttnParams params(std::int64_t heads, std::int64_t kv_heads) const {
    kernels::AttnParams p;
    p.heads = heads;
    p.kv_heads = kv_heads;
    p.head_dim = cfg.head_dim;
    p.scale = cfg.scale;
    p.mask = cfg.causal ? kernels::Mask::Causal : kernels::Mask::None;
    return p;
  }
};

// One strategy on one rank: what it sets up once and what its forward keeps for its backward.
// forward writes s.o and s.lse (the backward reads them) and o; backward writes dq, dk, dv.
class AttnImpl {
 public:
  explicit AttnImpl(AttnStep& s) : s_(s) {}
  virtual ~AttnImpl() = default;
  AttnImpl(const AttnImpl&) = delete;
  AttnImpl& operator=(const AttnImpl&) = delete;
  virtual void forward(Tensor& o) = 0;
  virtual void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) = 0;
  virtual void release() {}                                              // drops what only its backward reads
  virtual std::vector<const CpAttention*> nested() const { return {}; }  // attentions it runs; their times add
  virtual const CpLevels* levels() const { return nullptr; }             // two-level groups (null before made)

 protected:
  AttnStep& s_;
};

// Not strategies of the deck, run by CpAttention itself: one rank (the kernels on the whole problem),
// and a per-document placement (whole documents locally, the split ones as a CP problem of their
// own, which gets `levels`).
std::unique_ptr<AttnImpl> make_local_attention(AttnStep& s);
std::unique_ptr<AttnImpl> make_documents_attention(AttnStep& s, std::shared_ptr<CpLevels> levels);

// The records, each defined beside its strategy object (cp/attention_<name>.cpp): name_strategy().
#define HCP_ATTN_STRATEGY(name, id) const AttnStrategyInfo& name##_strategy();
#include "cp/attn_registry.inc"
#undef HCP_ATTN_STRATEGY

inline Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype()); }
// The dtype of the log-sum-exp and of the merged outputs (the accumulation rule, core/dtype.hpp).
inline DType lse_dtype(const Tensor& q) { return acc_dtype(q.dtype()); }
// Appends g when it has at least one (query, key) pair.
inline void keep_segment(std::vector<kernels::AttnSegment>& segs, const kernels::AttnSegment& g) {
  if (g.q_len > 0 && g.kv_len > 0) segs.push_back(g);
}

}  // namespace hcp::cp
