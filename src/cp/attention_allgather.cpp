// Attention CP by all-gather of K/V and reduce-scatter of dK/dV: its strategy object, byte and
// memory models and record.
#include <algorithm>

#include "core/memory_parts.hpp"
#include "cp/attention_bodies.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

namespace {
// Local Q chunk segments against the global K/V of the same sequence, masked by global position;
// the pads (positions >= the real length) are neither queries nor keys.
std::vector<k::AttnSegment> allgather_segments(const SeqLayout& global, const SeqLayout& local, int cp, int r) {
  if (cp == 1) return k::segments_from_layout(global, global);  // one rank: the whole sequences, any length
  std::vector<k::AttnSegment> segs;
  for (std::int64_t s = 0; s < global.nseq(); ++s) {
    const std::int64_t c = global.len(s) / (2 * cp), lo = local.cu_seqlens[s], R = global.real(s);
    const auto real_rows = [&](std::int64_t pos0) { return std::clamp<std::int64_t>(R - pos0, 0, c); };
    keep_segment(segs, {lo, real_rows(r * c), global.cu_seqlens[s], R, r * c, 0});
    keep_segment(segs, {lo + c, real_rows((2 * cp - 1 - r) * c), global.cu_seqlens[s], R, (2 * cp - 1 - r) * c, 0});
  }
  return segs;
}

class AllGatherAttention final : public AttnImpl {
 public:
  using AttnImpl::AttnImpl;
  void release() override { release_saved(kg_, vg_); }

  void forward(Tensor& o) override {
    PhaseTimes& c = s_.fwd_ph;
    c.start_laps(s_.q.space());
    kg_ = dcs_gather(s_.comm, s_.k, s_.cfg.placement.global);
    vg_ = dcs_gather(s_.comm, s_.v, s_.cfg.placement.global);
    c.lap("comm_wait");
    auto p = s_.params(s_.cfg.heads, s_.cfg.kv_heads);
    p.segments = allgather_segments(s_.cfg.placement.global, s_.local, s_.cp, s_.rank);
    s_.o = Tensor::zeros(s_.q.shape(), s_.q.dtype());
    s_.lse = Tensor::zeros({s_.tl, s_.cfg.heads}, lse_dtype(s_.q));
    k::attention_fwd(s_.o, s_.lse, s_.q, kg_, vg_, p);
    c.lap("compute");
    o.copy_from(s_.o.view(o.shape()));
  }

  void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) override {
    PhaseTimes& c = s_.bwd_ph;
    c.start_laps(s_.q.space());
    auto p = s_.params(s_.cfg.heads, s_.cfg.kv_heads);
    p.segments = allgather_segments(s_.cfg.placement.global, s_.local, s_.cp, s_.rank);
    Tensor dkg = zeros_like(kg_), dvg = zeros_like(vg_), dql = zeros_like(s_.q);
    k::attention_bwd(dql, dkg, dvg, s_.q, kg_, vg_, s_.o, s_.lse, dout, p);
    c.lap("compute");
    // Global order -> rank-major, then reduce-scatter: each owner gets the sum of every rank's part.
    Tensor dk_rm = dcs_redo(dkg, s_.cfg.placement.global, s_.cp), dv_rm = dcs_redo(dvg, s_.cfg.placement.global, s_.cp);
    Tensor dkl = Tensor::zeros(s_.k.shape(), s_.k.dtype()), dvl = Tensor::zeros(s_.v.shape(), s_.v.dtype());
    s_.comm.reduce_scatter(dk_rm, dkl);
    s_.comm.reduce_scatter(dv_rm, dvl);
    c.lap("comm_wait");
    dq.copy_from(dql.view(dq.shape()));
    dk.copy_from(dkl.view(dk.shape()));
    dv.copy_from(dvl.view(dv.shape()));
  }

 private:
  Tensor kg_, vg_;  // the global K/V, saved by forward
};

// Every other rank receives the local K/V; the backward reduce-scatters dK/dV, as many values.
std::int64_t allgather_model_bytes(const CpAttnConfig& cfg, int cp, int /*rank*/, DType dt, bool /*backward*/) {
  const std::int64_t tl = local_layout(cfg.placement.global, cp).total();
  return (cp - 1) * 2 * tl * cfg.kv_heads * cfg.head_dim * static_cast<std::int64_t>(dtype_size(dt));
}

// Memory: the saved o and LSE, dQ; the global K/V, their gradients and the rank-major copies for the
// reduce-scatter (each cp times this rank's K/V), this rank's dK/dV.
std::int64_t allgather_work_bytes(const MemoryModel& m, const AttnMemShape& s) {
  const std::int64_t Q = m.mul(m.mul(s.tl, s.heads * s.head_dim), s.es),
                     KV = m.mul(m.mul(s.tl, s.kv_heads * s.head_dim), s.es);
  const std::int64_t lse = m.mul(s.tl, s.heads * acc_bytes(s.es));
  return m.sum(m.sum(2 * Q, m.mul(6 * s.cp, KV)), 2 * KV + lse);
}

// The kernels read the gathered K/V: cp x tl tokens.
std::int64_t allgather_kernel_elements(const MemoryModel& m, const AttnMemShape& s) {
  return m.sum(m.mul(m.mul(4, s.tl), s.heads * s.head_dim),
               m.mul(m.mul(4, m.mul(s.tl, s.cp)), s.kv_heads * s.head_dim));
}

}  // namespace

const AttnStrategyInfo& allgather_strategy() {
  static const AttnStrategyInfo r{
      .id = AttnStrategy::ALLGATHER,
      .name = "allgather",
      .summary = "all-gather of K/V, reduce-scatter of dK/dV",
      .check = nullptr,
      .make = [](AttnStep& s, std::shared_ptr<CpLevels>) -> std::unique_ptr<AttnImpl> {
        return std::make_unique<AllGatherAttention>(s);
      },
      .model_bytes = allgather_model_bytes,
      .work_bytes = allgather_work_bytes,
      .kernel_elements = allgather_kernel_elements,
      // the all-gathers of K and V, the reduce-scatters of dK and dV
      .exchange_messages = [](int cp, int) { return 2 * static_cast<std::int64_t>(cp - 1); },
      .ring_ranks = [](int, int) { return 1; },
  };
  return r;
}

}  // namespace hcp::cp
