// Attention CP by all-gather of K/V and reduce-scatter of dK/dV (CpAttention's members for it, and
// its byte model).
#include <algorithm>

#include "core/memory_model.hpp"
#include "cp/attention_bodies.hpp"
#include "cp/attention_cp.hpp"
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

}  // namespace

void CpAttention::fwd_allgather(Tensor& o) {
  PhaseTimes& c = fwd_ph_;
  c.start_laps(q_.space());
  kg_ = dcs_gather(comm_, k_, cfg_.global);
  vg_ = dcs_gather(comm_, v_, cfg_.global);
  c.lap("comm_wait");
  auto p = base_params(cfg_.heads, cfg_.kv_heads);
  p.segments = allgather_segments(cfg_.global, local_, cp_, rank_);
  o_ = Tensor::zeros(q_.shape(), q_.dtype());
  lse_ = Tensor::zeros({tl_, cfg_.heads}, lse_dtype(q_));
  k::attention_fwd(o_, lse_, q_, kg_, vg_, p);
  c.lap("compute");
  o.copy_from(o_.view(o.shape()));
}

void CpAttention::bwd_allgather(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  PhaseTimes& c = bwd_ph_;
  c.start_laps(q_.space());
  auto p = base_params(cfg_.heads, cfg_.kv_heads);
  p.segments = allgather_segments(cfg_.global, local_, cp_, rank_);
  Tensor dkg = zeros_like(kg_), dvg = zeros_like(vg_), dql = zeros_like(q_);
  k::attention_bwd(dql, dkg, dvg, q_, kg_, vg_, o_, lse_, dout, p);
  c.lap("compute");
  // Global order -> rank-major, then reduce-scatter: each owner gets the sum of every rank's part.
  Tensor dk_rm = dcs_redo(dkg, cfg_.global, cp_), dv_rm = dcs_redo(dvg, cfg_.global, cp_);
  Tensor dkl = Tensor::zeros(k_.shape(), k_.dtype()), dvl = Tensor::zeros(v_.shape(), v_.dtype());
  comm_.reduce_scatter(dk_rm, dkl);
  comm_.reduce_scatter(dv_rm, dvl);
  c.lap("comm_wait");
  dq.copy_from(dql.view(dq.shape()));
  dk.copy_from(dkl.view(dk.shape()));
  dv.copy_from(dvl.view(dv.shape()));
}

// Every other rank receives the local K/V; the backward reduce-scatters dK/dV, as many values.
std::int64_t allgather_model_bytes(const CpAttnConfig& cfg, int cp, int /*rank*/, DType dt, bool /*backward*/) {
  const std::int64_t tl = local_layout(cfg.global, cp).total();
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

}  // namespace hcp::cp
