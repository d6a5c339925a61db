#include "cp/attention_cp.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "cp/layout.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

namespace {
Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype()); }
DType lse_dtype(const Tensor& q) { return q.dtype() == DType::F64 ? DType::F64 : DType::F32; }
}  // namespace

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
  if (cfg.strategy == AttnStrategy::A2A)
    HCP_CHECK(cfg.heads % cp == 0, "a2a attention needs attention.heads (", cfg.heads, ") divisible by cp (", cp, ")");
  if (cfg.strategy == AttnStrategy::A2AP2P && cp > 1) {  // at cp = 1 the local kernels run
    HCP_CHECK(cfg.cp_inner >= 1 && cp % cfg.cp_inner == 0, "a2a+p2p attention needs parallel.cp_inner (", cfg.cp_inner,
              ") to divide the CP size (", cp, ")");
    HCP_CHECK(cfg.heads % cfg.cp_inner == 0, "a2a+p2p attention needs attention.heads (", cfg.heads,
              ") divisible by parallel.cp_inner (", cfg.cp_inner, ")");
  }
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
  if (cfg_.strategy == AttnStrategy::A2A) {
    KvHeadRanges r = kv_head_ranges(cfg_.heads, cfg_.kv_heads, cp_, rank_);
    kv_lo_ = std::move(r.lo);
    kv_n_ = std::move(r.n);
    kv_map_ = std::move(r.map);
    // Each rank's K/V heads of every token, in global order: the inner exchange of a2a+p2p with the
    // whole group inside (one outer rank, whose DCS order at cp 1 is the global order).
    if (cp_ > 1)
      xkv_ = std::make_unique<HeadExchange>(comm_, kv_lo_, kv_n_, inner_to_outer_rows(cfg_.global, cp_, cp_, rank_),
                                            cfg_.global.total());
  }
  if (cfg_.strategy == AttnStrategy::A2AP2P && cp_ > 1) {
    inner_ = cfg_.cp_inner;
    outer_ = cp_ / inner_;
    KvHeadRanges r = kv_head_ranges(cfg_.heads, cfg_.kv_heads, inner_, rank_ % inner_);
    kv_lo_ = std::move(r.lo);
    kv_n_ = std::move(r.n);
    kv_map_ = std::move(r.map);
    HCP_CHECK(!levels_ || levels_->inner == inner_, "a2a+p2p: levels of inner size ", levels_ ? levels_->inner : 0,
              " given to a layer of parallel.cp_inner ", inner_);
  }
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
  switch (cfg_.strategy) {
    case AttnStrategy::P2P:
      fwd_p2p(o);
      break;
    case AttnStrategy::AllGather:
      fwd_allgather(o);
      break;
    case AttnStrategy::A2A:
      fwd_a2a(o);
      break;
    case AttnStrategy::A2AP2P:
      fwd_a2a_p2p(o);
      break;
  }
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
    switch (cfg_.strategy) {
      case AttnStrategy::P2P:
        bwd_p2p(dq, dk, dv, dov);
        break;
      case AttnStrategy::AllGather:
        bwd_allgather(dq, dk, dv, dov);
        break;
      case AttnStrategy::A2A:
        bwd_a2a(dq, dk, dv, dov);
        break;
      case AttnStrategy::A2AP2P:
        bwd_a2a_p2p(dq, dk, dv, dov);
        break;
    }
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

// A segment with at least one (query, key) pair.
static void keep(std::vector<k::AttnSegment>& segs, const k::AttnSegment& g) {
  if (g.q_len > 0 && g.kv_len > 0) segs.push_back(g);
}

// ---- ring p2p ---------------------------------------------------------------------------------
// Segments of ring step i (K/V from rank j = r - i), per sequence, by the DualChunkSwap rules: the
// diagonal block causal; K/V of an earlier rank: all queries against its first K/V half; of a later
// rank: the second query half against all its K/V. Pads (at the end of a sequence, so a suffix of
// every rank's rows: cp::local_real) are neither queries nor keys.
static std::vector<k::AttnSegment> ring_segments(const SeqLayout& global, const SeqLayout& local, int cp, int r, int j,
                                                 bool causal) {
  std::vector<k::AttnSegment> segs;
  for (std::int64_t s = 0; s < local.nseq(); ++s) {
    const std::int64_t lo = local.cu_seqlens[s], n = local.len(s), half = n / 2;
    const std::int64_t rq = local_real(global, s, cp, r), rk = local_real(global, s, cp, j);
    if (!causal || j == r) {
      keep(segs, {lo, rq, lo, rk, 0, 0});  // j == r with causal: local order is increasing
    } else if (j < r) {
      keep(segs, {lo, rq, lo, std::min(half, rk), 0, 0});  // all Q vs the first K/V chunk (c_j), no mask
    } else {
      keep(segs, {lo + half, rq - half, lo, rk, 0, 0});  // second Q chunk vs all K/V, no mask
    }
  }
  return segs;
}

Tensor CpAttention::ring_kv_buffer() const {
  const std::int64_t Hkv = cfg_.kv_heads, D = cfg_.head_dim;
  Tensor buf = Tensor::empty({2, tl_, Hkv, D}, k_.dtype());
  buf.slice(0, 0, 1).view({tl_, Hkv, D}).copy_from(k_);
  buf.slice(0, 1, 1).view({tl_, Hkv, D}).copy_from(v_);
  return buf;
}

k::AttnParams CpAttention::ring_params(int i) const {
  const int j = ((rank_ - i) % cp_ + cp_) % cp_;  // owner of the K/V held at step i
  auto p = base_params(cfg_.heads, cfg_.kv_heads);
  p.mask = (cfg_.causal && i == 0) ? k::Mask::Causal : k::Mask::None;
  p.segments = ring_segments(cfg_.global, local_, cp_, rank_, j, cfg_.causal);
  return p;
}

// Sends `send` to the next rank and receives into `recv` from the previous one, unless step i is
// the last K/V step (a negative step always posts: the dK/dV accumulator moves after every step).
RingRequest CpAttention::ring_post_next(Tensor& send, Tensor& recv, int i, int tag) {
  if (i >= 0 && i + 1 >= cp_) return {};
  return comm_.ring_post(send.raw(), recv.raw(), send.numel(), send.dtype(), (rank_ + 1) % cp_, (rank_ - 1 + cp_) % cp_,
                         tag);
}

void CpAttention::fwd_p2p(Tensor& o) {
  const DType dt = q_.dtype(), acc_dt = lse_dtype(q_);
  const std::int64_t H = cfg_.heads, Hkv = cfg_.kv_heads, D = cfg_.head_dim;
  // K and V travel together in one buffer [2, Tl, Hkv, D]; double buffered. The output is merged in
  // fp32 for bf16 (fp64/fp32 otherwise) and rounded once at the end, as the cp=1 kernel does.
  Tensor cur = ring_kv_buffer(), nxt = Tensor::empty(cur.shape(), dt);
  Tensor oacc = Tensor::zeros({tl_, H, D}, acc_dt);
  lse_ = Tensor::zeros({tl_, H}, acc_dt);
  lse_.fill(-INFINITY);
  Tensor op = Tensor::zeros({tl_, H, D}, dt), lp = Tensor::zeros({tl_, H}, acc_dt);
  PhaseTimes& c = fwd_ph_;
  c.start_laps(q_.space());
  for (int i = 0; i < cp_; ++i) {
    RingRequest req = ring_post_next(cur, nxt, i);
    c.lap("");
    const auto p = ring_params(i);
    Tensor kb = cur.slice(0, 0, 1).view({tl_, Hkv, D}), vb = cur.slice(0, 1, 1).view({tl_, Hkv, D});
    k::attention_fwd(op, lp, q_, kb, vb, p);
    k::attention_merge(oacc, lse_, op, lp);
    c.lap("compute");
    if (req.active) {
      comm_.ring_wait(req);
      c.lap("comm_wait");
      std::swap(cur, nxt);
    }
  }
  o_ = acc_dt == dt ? oacc : oacc.to(dt);
  o.copy_from(o_.view(o.shape()));
}

void CpAttention::bwd_p2p(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  const DType dt = q_.dtype(), acc_dt = lse_dtype(q_);
  const std::int64_t H = cfg_.heads, Hkv = cfg_.kv_heads, D = cfg_.head_dim;
  // K/V travel as in the forward. Their gradient accumulator [2, Tl, Hkv, D] (fp32 for bf16, so it
  // is rounded once, at its owner) travels one step behind: the accumulator of the block held at
  // step i arrives while step i computes, is waited for after it, and goes on to the next rank;
  // after the last step it reaches the block's owner.
  Tensor cur = ring_kv_buffer(), nxt = Tensor::empty(cur.shape(), dt);
  Tensor acc = Tensor::zeros({2, tl_, Hkv, D}, acc_dt), acc_in = Tensor::zeros({2, tl_, Hkv, D}, acc_dt);
  Tensor dq_acc = Tensor::zeros({tl_, H, D}, acc_dt), dq_p = Tensor::zeros({tl_, H, D}, dt);
  Tensor dk_p = Tensor::zeros({tl_, Hkv, D}, dt), dv_p = Tensor::zeros({tl_, Hkv, D}, dt);
  RingRequest ra;  // the accumulator in flight
  PhaseTimes& c = bwd_ph_;
  c.start_laps(q_.space());
  for (int i = 0; i < cp_; ++i) {
    RingRequest req = ring_post_next(cur, nxt, i);
    c.lap("");
    const auto p = ring_params(i);
    Tensor kb = cur.slice(0, 0, 1).view({tl_, Hkv, D}), vb = cur.slice(0, 1, 1).view({tl_, Hkv, D});
    k::attention_bwd(dq_p, dk_p, dv_p, q_, kb, vb, o_, lse_, dout, p);
    k::axpy(dq_acc, 1.0, dq_p);
    c.lap("compute");
    if (ra.active) {  // this block's accumulator, from the previous rank
      comm_.ring_wait(ra);
      std::swap(acc, acc_in);
      c.lap("comm_wait");
    }
    Tensor ak = acc.slice(0, 0, 1).view({tl_, Hkv, D}), av = acc.slice(0, 1, 1).view({tl_, Hkv, D});
    k::axpy(ak, 1.0, dk_p);
    k::axpy(av, 1.0, dv_p);
    c.lap("compute");
    ra = ring_post_next(acc, acc_in, -1, 9);  // on to the next rank (after the last step: the owner)
    if (req.active) {
      comm_.ring_wait(req);
      std::swap(cur, nxt);
      c.lap("comm_wait");
    }
  }
  comm_.ring_wait(ra);
  std::swap(acc, acc_in);
  c.lap("comm_wait");
  const auto out = [&](const Tensor& t) { return acc_dt == dt ? t : t.to(dt); };
  dq.copy_from(out(dq_acc).view(dq.shape()));
  dk.copy_from(out(acc.slice(0, 0, 1)).view(dk.shape()));
  dv.copy_from(out(acc.slice(0, 1, 1)).view(dv.shape()));
}

// ---- all-gather ---------------------------------------------------------------------------------
// Local Q chunk segments against the global K/V of the same sequence, masked by global position;
// the pads (positions >= the real length) are neither queries nor keys.
static std::vector<k::AttnSegment> allgather_segments(const SeqLayout& global, const SeqLayout& local, int cp, int r) {
  if (cp == 1) return k::segments_from_layout(global, global);  // one rank: the whole sequences, any length
  std::vector<k::AttnSegment> segs;
  for (std::int64_t s = 0; s < global.nseq(); ++s) {
    const std::int64_t c = global.len(s) / (2 * cp), lo = local.cu_seqlens[s], R = global.real(s);
    const auto real_rows = [&](std::int64_t pos0) { return std::clamp<std::int64_t>(R - pos0, 0, c); };
    keep(segs, {lo, real_rows(r * c), global.cu_seqlens[s], R, r * c, 0});
    keep(segs, {lo + c, real_rows((2 * cp - 1 - r) * c), global.cu_seqlens[s], R, (2 * cp - 1 - r) * c, 0});
  }
  return segs;
}

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

// ---- Ulysses all-to-all -------------------------------------------------------------------------
namespace {
// [Tl, Hx, D] local (all heads) <-> [T, Hx/cp, D] global order (this rank's head block).
Tensor seq_to_head(Communicator& comm, const Tensor& x, const SeqLayout& global) {
  const std::int64_t hb = x.size(1) / comm.size(), D = x.size(2);
  return cp2hp(comm, x.is_contiguous() ? x : x.clone(), global).view({global.total(), hb, D});
}
Tensor head_to_seq(Communicator& comm, const Tensor& xh, const SeqLayout& global) {
  const std::int64_t hb = xh.size(1), D = xh.size(2);
  return hp2cp(comm, xh, global).view({global.total() / comm.size(), hb * comm.size(), D});
}
}  // namespace

void CpAttention::fwd_a2a(Tensor& o) {
  PhaseTimes& c = fwd_ph_;
  c.start_laps(q_.space());
  const std::int64_t Hl = cfg_.heads / cp_;
  qh_ = seq_to_head(comm_, q_, cfg_.global);
  kh_ = xkv_->to_heads(k_);
  vh_ = xkv_->to_heads(v_);
  c.lap("comm_wait");
  if (!kv_map_.empty()) {
    kh_ = expand_heads(kh_, kv_map_);
    vh_ = expand_heads(vh_, kv_map_);
  }
  auto p = base_params(Hl, kh_.size(1));
  p.segments = k::segments_from_layout(cfg_.global, cfg_.global);
  oh_ = Tensor::zeros(qh_.shape(), q_.dtype());
  lse_ = Tensor::zeros({cfg_.global.total(), Hl}, lse_dtype(q_));
  k::attention_fwd(oh_, lse_, qh_, kh_, vh_, p);
  c.lap("compute");
  o_ = head_to_seq(comm_, oh_, cfg_.global);
  c.lap("comm_wait");
  o.copy_from(o_.view(o.shape()));
}

void CpAttention::bwd_a2a(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  PhaseTimes& c = bwd_ph_;
  c.start_laps(q_.space());
  const std::int64_t Hl = cfg_.heads / cp_, n = kv_n_[static_cast<std::size_t>(rank_)];
  Tensor doh = seq_to_head(comm_, dout, cfg_.global);
  c.lap("comm_wait");
  auto p = base_params(Hl, kh_.size(1));
  p.segments = k::segments_from_layout(cfg_.global, cfg_.global);
  Tensor dqh = zeros_like(qh_), dkh = zeros_like(kh_), dvh = zeros_like(vh_);
  k::attention_bwd(dqh, dkh, dvh, qh_, kh_, vh_, oh_, lse_, doh, p);
  if (!kv_map_.empty()) {
    dkh = expand_heads_adjoint(dkh, kv_map_, n);
    dvh = expand_heads_adjoint(dvh, kv_map_, n);
  }
  c.lap("compute");
  Tensor dql = head_to_seq(comm_, dqh, cfg_.global);
  Tensor dkl = xkv_->to_tokens(dkh, cfg_.kv_heads), dvl = xkv_->to_tokens(dvh, cfg_.kv_heads);
  c.lap("comm_wait");
  dq.copy_from(dql.view(dq.shape()));
  dk.copy_from(dkl.view(dk.shape()));
  dv.copy_from(dvl.view(dv.shape()));
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

std::int64_t a2a_p2p_ring_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward) {
  if (cfg.docs)
    return cfg.docs->split.nseq() == 0 ? 0 : a2a_p2p_ring_bytes(split_documents_config(cfg), cp, rank, dt, backward);
  const int inner = cfg.cp_inner;
  return attention_cp_model_bytes(a2a_p2p_ring_config(cfg, rank), cp / inner, rank / inner, dt, backward);
}

std::int64_t attention_cp_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward) {
  if (cp == 1) return 0;  // one rank runs locally
  // per-document placement: whole documents send nothing; the split ones are a CP problem of their own
  if (cfg.docs)
    return cfg.docs->split.nseq() == 0 ? 0
                                       : attention_cp_model_bytes(split_documents_config(cfg), cp, rank, dt, backward);
  const std::int64_t tl = local_layout(cfg.global, cp).total(), D = cfg.head_dim, H = cfg.heads;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt)), kv = 2 * tl * cfg.kv_heads * D;
  // the dK/dV accumulator of a ring travels in fp32 for bf16
  const auto acc_es = static_cast<std::int64_t>(dtype_size(dt == DType::BF16 ? DType::F32 : dt));
  switch (cfg.strategy) {
    case AttnStrategy::P2P:  // cp-1 ring steps of local K/V; backward adds the accumulator ring
      return backward ? (cp - 1) * kv * es + cp * kv * acc_es : (cp - 1) * kv * es;
    case AttnStrategy::AllGather:  // every other rank gets local K/V; backward reduce-scatters dK/dV
      return (cp - 1) * kv * es;
    case AttnStrategy::A2A: {  // q in and o out (dout in and dq out): (cp-1)/cp of each; K/V heads
      const std::int64_t q = tl * H * D;
      const std::vector<std::int64_t> n = kv_head_ranges(H, cfg.kv_heads, cp, rank).n;
      std::int64_t heads_out = 0;  // forward: each other rank its K/V heads of this rank's tokens
      for (int r = 0; r < cp; ++r) heads_out += r == rank ? 0 : n[static_cast<std::size_t>(r)];
      // backward: the gradients of this rank's K/V heads of every other rank's tokens, to their owners
      const std::int64_t kv_part = backward ? (cp - 1) * n[static_cast<std::size_t>(rank)] : heads_out;
      return ((cp - 1) * 2 * q / cp + 2 * tl * kv_part * D) * es;
    }
    case AttnStrategy::A2AP2P: {  // inner: as a2a on inner ranks; outer: the p2p ring's own model
      check_attention_cp_shape(cfg, cp);
      const int inner = cfg.cp_inner, me = rank % inner;
      const std::vector<std::int64_t> n = kv_head_ranges(H, cfg.kv_heads, inner, me).n;
      std::int64_t heads_out = 0;
      for (int j = 0; j < inner; ++j) heads_out += j == me ? 0 : n[static_cast<std::size_t>(j)];
      const std::int64_t kv_part = backward ? (inner - 1) * n[static_cast<std::size_t>(me)] : heads_out;
      const std::int64_t a2a = (2 * tl * (H - H / inner) * D + 2 * tl * kv_part * D) * es;
      return a2a + a2a_p2p_ring_bytes(cfg, cp, rank, dt, backward);
    }
  }
  return 0;
}

}  // namespace hcp::cp
