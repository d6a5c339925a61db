#include "cp/attention_cp.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "cp/attention_bodies.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

void check_attention_cp_shape(const CpAttnConfig& cfg, int cp) {
  HCP_CHECK(cfg.heads > 0 && cfg.kv_heads > 0 && cfg.heads % cfg.kv_heads == 0, "attention.heads (", cfg.heads,
            ") must be a positive multiple of attention.kv_heads (", cfg.kv_heads, ")");
  if (cfg.docs) {
    HCP_CHECK(cfg.docs->cp == cp, "attention CP layout: documents placed over ", cfg.docs->cp, " ranks, run on ", cp);
    const SeqLayout u = cfg.global.unpadded();
    bool same = u.nseq() == static_cast<std::int64_t>(cfg.docs->lens.size());
    for (std::int64_t s = 0; same && s < u.nseq(); ++s) same = u.len(s) == cfg.docs->lens[static_cast<std::size_t>(s)];
    HCP_CHECK(same, "attention CP layout: the documents placed are not the sequences of the layout");
  } else {
    require_dcs_divisible(cfg.global, cp, "attention CP layout");
  }
  if (const auto check = attn_strategy_info(cfg.strategy).check) check(cfg, cp);
}

CpAttention::CpAttention(Communicator& comm, CpAttnConfig cfg, std::shared_ptr<CpLevels> levels)
    : comm_(comm), cfg_(std::move(cfg)), levels_(std::move(levels)) {
  cp_ = comm_.size();
  rank_ = comm_.rank();
  check_attention_cp_shape(cfg_, cp_);
  if (cfg_.docs) {  // whole documents here; the split ones in an attention of their own
    local_ = cfg_.docs->whole[static_cast<std::size_t>(rank_)];
    tl_ = cfg_.docs->local_rows(rank_);
    if (cfg_.docs->split.nseq() > 0)
      split_ = std::make_unique<CpAttention>(comm_, split_documents_config(cfg_), std::move(levels_));
    return;
  }
  local_ = local_layout(cfg_.global, cp_);
  tl_ = local_.total();
  if (const auto init = attn_strategy_info(cfg_.strategy).init) (this->*init)();
}

k::AttnParams CpAttention::base_params(std::int64_t heads, std::int64_t kv_heads) const {
  k::AttnParams p;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = cfg_.head_dim;
  p.scale = cfg_.scale;
  p.mask = cfg_.causal ? k::Mask::Causal : k::Mask::None;
  return p;
}

void CpAttention::forward(Tensor& o, const Tensor& q, const Tensor& kk, const Tensor& v) {
  SpaceScope space_scope(q.space());  // work tensors live where the inputs do
  const std::int64_t H = cfg_.heads, Hkv = cfg_.kv_heads, D = cfg_.head_dim;
  HCP_CHECK(q.numel() == tl_ * H * D, "cp attention: q has shape ", shape_str(q.shape()), ", expected [", tl_, ", ", H,
            ", ", D, "] (local tokens = global / cp)");
  HCP_CHECK(kk.numel() == tl_ * Hkv * D && v.numel() == kk.numel(), "cp attention: k/v must be [", tl_, ", ", Hkv, ", ",
            D, "]");
  HCP_CHECK(o.numel() == q.numel(), "cp attention: o must match q");
  q_ = q.view({tl_, H, D});
  k_ = kk.view({tl_, Hkv, D});
  v_ = v.view({tl_, Hkv, D});
  fwd_ph_.reset();
  if (cfg_.docs) return fwd_docs(o);
  if (cp_ == 1) return fwd_local(o);
  (this->*attn_strategy_info(cfg_.strategy).forward)(o);
}

void CpAttention::backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  SpaceScope space_scope(dout.space());  // work tensors live where the inputs do
  HCP_CHECK(o_.defined(), "cp attention: backward() before forward()");
  HCP_CHECK(
      dout.numel() == q_.numel() && dq.numel() == q_.numel() && dk.numel() == k_.numel() && dv.numel() == v_.numel(),
      "cp attention backward: gradient shapes do not match the forward's inputs");
  bwd_ph_.reset();
  Tensor dov = dout.view(q_.shape());
  if (cfg_.docs) {
    bwd_docs(dq, dk, dv, dov);
  } else if (cp_ == 1) {
    bwd_local(dq, dk, dv, dov);
  } else {
    (this->*attn_strategy_info(cfg_.strategy).backward)(dq, dk, dv, dov);
  }
  release_saved(q_, k_, v_, o_, lse_, kg_, vg_, qh_, kh_, vh_, oh_);
}

// ---- one rank --------------------------------------------------------------------------------
// cp = 1, whatever the strategy: the kernels on the local tensors (the whole problem), with no ring,
// gather or all-to-all and no staging copy; the gradients are written in place.
void CpAttention::fwd_local(Tensor& o) {
  PhaseTimes& c = fwd_ph_;
  c.start_laps(q_.space());
  auto p = base_params(cfg_.heads, cfg_.kv_heads);
  p.segments = k::segments_from_layout(cfg_.global, cfg_.global);
  o_ = Tensor::zeros(q_.shape(), q_.dtype());
  lse_ = Tensor::zeros({tl_, cfg_.heads}, lse_dtype(q_));
  k::attention_fwd(o_, lse_, q_, k_, v_, p);
  o.copy_from(o_.view(o.shape()));
  c.lap("compute");
}

void CpAttention::bwd_local(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  PhaseTimes& c = bwd_ph_;
  c.start_laps(q_.space());
  auto p = base_params(cfg_.heads, cfg_.kv_heads);
  p.segments = k::segments_from_layout(cfg_.global, cfg_.global);
  if (dq.is_contiguous() && dk.is_contiguous() && dv.is_contiguous()) {
    Tensor dqv = dq.view(q_.shape()), dkv = dk.view(k_.shape()), dvv = dv.view(v_.shape());
    k::attention_bwd(dqv, dkv, dvv, q_, k_, v_, o_, lse_, dout, p);
  } else {
    Tensor dql = zeros_like(q_), dkl = zeros_like(k_), dvl = zeros_like(v_);
    k::attention_bwd(dql, dkl, dvl, q_, k_, v_, o_, lse_, dout, p);
    dq.copy_from(dql.view(dq.shape()));
    dk.copy_from(dkl.view(dk.shape()));
    dv.copy_from(dvl.view(dv.shape()));
  }
  c.lap("compute");
}

namespace {
// A pass's laps, plus `ring` (a2a+p2p: its ring's own split; zeros otherwise).
CpAttnTimes times_of(const PhaseTimes& ph, const CpAttnTimes& ring) {
  const auto& t = ph.totals();
  const auto s = [&](const char* k) { return t.count(k) ? t.at(k) / 1e3 : 0.0; };
  return {s("compute") + ring.compute, s("comm_wait") + ring.comm_wait};
}
}  // namespace

CpAttnTimes CpAttention::fwd_times() const {
  const CpAttention* sub = ring_ ? ring_.get() : split_.get();
  return times_of(fwd_ph_, sub ? sub->fwd_times() : CpAttnTimes{});
}
CpAttnTimes CpAttention::bwd_times() const {
  const CpAttention* sub = ring_ ? ring_.get() : split_.get();
  return times_of(bwd_ph_, sub ? sub->bwd_times() : CpAttnTimes{});
}

std::int64_t CpAttention::model_fwd_bytes(DType dt) const {
  return attention_cp_model_bytes(cfg_, cp_, rank_, dt, false);
}
std::int64_t CpAttention::model_bwd_bytes(DType dt) const {
  return attention_cp_model_bytes(cfg_, cp_, rank_, dt, true);
}

std::int64_t attention_cp_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward) {
  if (cp == 1) return 0;  // one rank runs locally
  // per-document placement: whole documents send nothing; the split ones are a CP problem of their own
  if (cfg.docs)
    return cfg.docs->split.nseq() == 0 ? 0
                                       : attention_cp_model_bytes(split_documents_config(cfg), cp, rank, dt, backward);
  return attn_strategy_info(cfg.strategy).model_bytes(cfg, cp, rank, dt, backward);
}

}  // namespace hcp::cp
