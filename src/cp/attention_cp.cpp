#include "cp/attention_cp.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "cp/layout.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;


namespace {
struct Clock {
  double t0 = MPI_Wtime();
  double lap() {
    double t = MPI_Wtime(), d = t - t0;
    t0 = t;
    return d;
  }
};
Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype()); }
DType lse_dtype(const Tensor& q) { return q.dtype() == DType::F64 ? DType::F64 : DType::F32; }
}  // namespace

CpAttention::CpAttention(Communicator& comm, CpAttnConfig cfg) : comm_(comm), cfg_(std::move(cfg)) {
  cp_ = comm_.size();
  rank_ = comm_.rank();
  HCP_CHECK(cfg_.heads > 0 && cfg_.kv_heads > 0 && cfg_.heads % cfg_.kv_heads == 0, "attention.heads (", cfg_.heads,
            ") must be a positive multiple of attention.kv_heads (", cfg_.kv_heads, ")");
  require_dcs_divisible(cfg_.global, cp_, "attention CP layout");
  local_ = local_layout(cfg_.global, cp_);
  tl_ = local_.total();
  if (cfg_.strategy == AttnStrategy::A2A) {
    HCP_CHECK(cfg_.heads % cp_ == 0, "a2a attention needs attention.heads (", cfg_.heads, ") divisible by cp (", cp_, ")");
    if (cfg_.kv_heads >= cp_) {
      HCP_CHECK(cfg_.kv_heads % cp_ == 0, "a2a attention needs attention.kv_heads (", cfg_.kv_heads,
                ") divisible by cp (", cp_, ") when kv_heads >= cp");
    } else {
      HCP_CHECK(cp_ % cfg_.kv_heads == 0, "a2a attention with kv_heads (", cfg_.kv_heads, ") < cp (", cp_,
                ") replicates K/V heads and needs cp % kv_heads == 0");
      kv_rep_ = cp_ / cfg_.kv_heads;
    }
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
  HCP_CHECK(kk.numel() == tl_ * Hkv * D && v.numel() == kk.numel(), "cp attention: k/v must be [", tl_, ", ", Hkv,
            ", ", D, "]");
  HCP_CHECK(o.numel() == q.numel(), "cp attention: o must match q");
  q_ = q.view({tl_, H, D});
  k_ = kk.view({tl_, Hkv, D});
  v_ = v.view({tl_, Hkv, D});
  fwd_t_ = {};
  switch (cfg_.strategy) {
    case AttnStrategy::P2P: fwd_p2p(o); break;
    case AttnStrategy::AllGather: fwd_allgather(o); break;
    case AttnStrategy::A2A: fwd_a2a(o); break;
  }
}

void CpAttention::backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  SpaceScope space_scope(dout.space());  // work tensors live where the inputs do
  HCP_CHECK(o_.defined(), "cp attention: backward() before forward()");
  HCP_CHECK(dout.numel() == q_.numel() && dq.numel() == q_.numel() && dk.numel() == k_.numel() &&
                dv.numel() == v_.numel(),
            "cp attention backward: gradient shapes do not match the forward's inputs");
  bwd_t_ = {};
  Tensor dov = dout.view(q_.shape());
  switch (cfg_.strategy) {
    case AttnStrategy::P2P: bwd_p2p(dq, dk, dv, dov); break;
    case AttnStrategy::AllGather: bwd_allgather(dq, dk, dv, dov); break;
    case AttnStrategy::A2A: bwd_a2a(dq, dk, dv, dov); break;
  }
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
  return comm_.ring_post(send.raw(), recv.raw(), send.numel(), send.dtype(), (rank_ + 1) % cp_,
                         (rank_ - 1 + cp_) % cp_, tag);
}

void CpAttention::fwd_p2p(Tensor& o) {
  const DType dt = q_.dtype();
  const std::int64_t H = cfg_.heads, Hkv = cfg_.kv_heads, D = cfg_.head_dim;
  // K and V travel together in one buffer [2, Tl, Hkv, D]; double buffered.
  Tensor cur = ring_kv_buffer(), nxt = Tensor::empty(cur.shape(), dt);
  o_ = Tensor::zeros({tl_, H, D}, dt);
  lse_ = Tensor::zeros({tl_, H}, lse_dtype(q_));
  lse_.fill(-INFINITY);
  Tensor op = Tensor::zeros({tl_, H, D}, dt), lp = Tensor::zeros({tl_, H}, lse_dtype(q_));
  Clock c;
  for (int i = 0; i < cp_; ++i) {
    RingRequest req = ring_post_next(cur, nxt, i);
    c.lap();
    const auto p = ring_params(i);
    Tensor kb = cur.slice(0, 0, 1).view({tl_, Hkv, D}), vb = cur.slice(0, 1, 1).view({tl_, Hkv, D});
    k::attention_fwd(op, lp, q_, kb, vb, p);
    k::attention_merge(o_, lse_, op, lp);
    fwd_t_.compute += c.lap();
    if (req.active) {
      comm_.ring_wait(req);
      fwd_t_.comm_wait += c.lap();
      std::swap(cur, nxt);
    }
  }
  o.copy_from(o_.view(o.shape()));
}

void CpAttention::bwd_p2p(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  const DType dt = q_.dtype();
  const std::int64_t H = cfg_.heads, Hkv = cfg_.kv_heads, D = cfg_.head_dim;
  // K/V travel as in the forward; their gradient accumulator [2, Tl, Hkv, D] travels with them and
  // reaches the block's owner after the last step.
  Tensor cur = ring_kv_buffer(), nxt = Tensor::empty(cur.shape(), dt);
  Tensor acc = Tensor::zeros({2, tl_, Hkv, D}, dt), acc_in = Tensor::zeros({2, tl_, Hkv, D}, dt);
  Tensor dq_acc = Tensor::zeros({tl_, H, D}, dt), dq_p = Tensor::zeros({tl_, H, D}, dt);
  Tensor dk_p = Tensor::zeros({tl_, Hkv, D}, dt), dv_p = Tensor::zeros({tl_, Hkv, D}, dt);
  Clock c;
  for (int i = 0; i < cp_; ++i) {
    RingRequest req = ring_post_next(cur, nxt, i);
    c.lap();
    const auto p = ring_params(i);
    Tensor kb = cur.slice(0, 0, 1).view({tl_, Hkv, D}), vb = cur.slice(0, 1, 1).view({tl_, Hkv, D});
    k::attention_bwd(dq_p, dk_p, dv_p, q_, kb, vb, o_, lse_, dout, p);
    k::axpy(dq_acc, 1.0, dq_p);
    Tensor ak = acc.slice(0, 0, 1).view({tl_, Hkv, D}), av = acc.slice(0, 1, 1).view({tl_, Hkv, D});
    k::axpy(ak, 1.0, dk_p);
    k::axpy(av, 1.0, dv_p);
    bwd_t_.compute += c.lap();
    // The accumulator goes on to the next rank (after the last step: to the block's owner).
    RingRequest ra = ring_post_next(acc, acc_in, -1, 9);
    comm_.ring_wait(ra);
    std::swap(acc, acc_in);
    if (req.active) {
      comm_.ring_wait(req);
      std::swap(cur, nxt);
    }
    bwd_t_.comm_wait += c.lap();
  }
  dq.copy_from(dq_acc.view(dq.shape()));
  dk.copy_from(acc.slice(0, 0, 1).view(dk.shape()));
  dv.copy_from(acc.slice(0, 1, 1).view(dv.shape()));
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
  Clock c;
  kg_ = dcs_gather(comm_, k_, cfg_.global);
  vg_ = dcs_gather(comm_, v_, cfg_.global);
  fwd_t_.comm_wait += c.lap();
  auto p = base_params(cfg_.heads, cfg_.kv_heads);
  p.segments = allgather_segments(cfg_.global, local_, cp_, rank_);
  o_ = Tensor::zeros(q_.shape(), q_.dtype());
  lse_ = Tensor::zeros({tl_, cfg_.heads}, lse_dtype(q_));
  k::attention_fwd(o_, lse_, q_, kg_, vg_, p);
  fwd_t_.compute += c.lap();
  o.copy_from(o_.view(o.shape()));
}

void CpAttention::bwd_allgather(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  Clock c;
  auto p = base_params(cfg_.heads, cfg_.kv_heads);
  p.segments = allgather_segments(cfg_.global, local_, cp_, rank_);
  Tensor dkg = zeros_like(kg_), dvg = zeros_like(vg_), dql = zeros_like(q_);
  k::attention_bwd(dql, dkg, dvg, q_, kg_, vg_, o_, lse_, dout, p);
  bwd_t_.compute += c.lap();
  // Global order -> rank-major, then reduce-scatter: each owner gets the sum of every rank's part.
  Tensor dk_rm = dcs_redo(dkg, cfg_.global, cp_), dv_rm = dcs_redo(dvg, cfg_.global, cp_);
  Tensor dkl = Tensor::zeros(k_.shape(), k_.dtype()), dvl = Tensor::zeros(v_.shape(), v_.dtype());
  comm_.reduce_scatter(dk_rm, dkl);
  comm_.reduce_scatter(dv_rm, dvl);
  bwd_t_.comm_wait += c.lap();
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
// Repeat each K/V head `rep` times along the head axis (rep = 1: unchanged).
Tensor repeat_heads(const Tensor& x, std::int64_t rep) {
  if (rep == 1) return x;
  const std::int64_t t = x.size(0), h = x.size(1), D = x.size(2);
  Tensor out = Tensor::empty({t, h * rep, D}, x.dtype());
  for (std::int64_t e = 0; e < h * rep; ++e) out.slice(1, e, 1).copy_from(x.slice(1, e / rep, 1));
  return out;
}
// Gradient of repeat_heads: sum the copies.
Tensor sum_heads(const Tensor& x, std::int64_t rep) {
  if (rep == 1) return x;
  const std::int64_t t = x.size(0), hr = x.size(1), D = x.size(2);
  Tensor out = Tensor::zeros({t, hr / rep, D}, x.dtype());
  for (std::int64_t e = 0; e < hr; ++e) {
    Tensor dst = out.slice(1, e / rep, 1).clone();
    k::axpy(dst, 1.0, x.slice(1, e, 1).clone());
    out.slice(1, e / rep, 1).copy_from(dst);
  }
  return out;
}
}  // namespace

void CpAttention::fwd_a2a(Tensor& o) {
  Clock c;
  const std::int64_t Hl = cfg_.heads / cp_, Hkvl = cfg_.kv_heads * kv_rep_ / cp_;
  qh_ = seq_to_head(comm_, q_, cfg_.global);
  kh_ = seq_to_head(comm_, repeat_heads(k_, kv_rep_), cfg_.global);
  vh_ = seq_to_head(comm_, repeat_heads(v_, kv_rep_), cfg_.global);
  fwd_t_.comm_wait += c.lap();
  auto p = base_params(Hl, Hkvl);
  p.segments = k::segments_from_layout(cfg_.global, cfg_.global);
  oh_ = Tensor::zeros(qh_.shape(), q_.dtype());
  lse_ = Tensor::zeros({cfg_.global.total(), Hl}, lse_dtype(q_));
  k::attention_fwd(oh_, lse_, qh_, kh_, vh_, p);
  fwd_t_.compute += c.lap();
  o_ = head_to_seq(comm_, oh_, cfg_.global);
  fwd_t_.comm_wait += c.lap();
  o.copy_from(o_.view(o.shape()));
}

void CpAttention::bwd_a2a(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  Clock c;
  const std::int64_t Hl = cfg_.heads / cp_, Hkvl = cfg_.kv_heads * kv_rep_ / cp_;
  Tensor doh = seq_to_head(comm_, dout, cfg_.global);
  bwd_t_.comm_wait += c.lap();
  auto p = base_params(Hl, Hkvl);
  p.segments = k::segments_from_layout(cfg_.global, cfg_.global);
  Tensor dqh = zeros_like(qh_), dkh = zeros_like(kh_), dvh = zeros_like(vh_);
  k::attention_bwd(dqh, dkh, dvh, qh_, kh_, vh_, oh_, lse_, doh, p);
  bwd_t_.compute += c.lap();
  Tensor dql = head_to_seq(comm_, dqh, cfg_.global);
  Tensor dkl = sum_heads(head_to_seq(comm_, dkh, cfg_.global), kv_rep_);
  Tensor dvl = sum_heads(head_to_seq(comm_, dvh, cfg_.global), kv_rep_);
  bwd_t_.comm_wait += c.lap();
  dq.copy_from(dql.view(dq.shape()));
  dk.copy_from(dkl.view(dk.shape()));
  dv.copy_from(dvl.view(dv.shape()));
}

std::int64_t CpAttention::model_fwd_bytes(DType dt) const {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt)), kv = 2 * tl_ * cfg_.kv_heads * cfg_.head_dim;
  switch (cfg_.strategy) {
    case AttnStrategy::P2P: return (cp_ - 1) * kv * es;             // cp-1 ring steps of local K/V
    case AttnStrategy::AllGather: return (cp_ - 1) * kv * es;       // every other rank gets local K/V
    case AttnStrategy::A2A: {
      const std::int64_t q = tl_ * cfg_.heads * cfg_.head_dim, kvr = kv * kv_rep_;
      return (cp_ - 1) * (2 * q + kvr) / cp_ * es;                   // q, k, v in; o out
    }
  }
  return 0;
}

std::int64_t CpAttention::model_bwd_bytes(DType dt) const {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt)), kv = 2 * tl_ * cfg_.kv_heads * cfg_.head_dim;
  switch (cfg_.strategy) {
    case AttnStrategy::P2P: return ((cp_ - 1) + cp_) * kv * es;  // K/V ring + dK/dV accumulator ring
    case AttnStrategy::AllGather: return (cp_ - 1) * kv * es;     // reduce-scatter of dK/dV
    case AttnStrategy::A2A: {
      const std::int64_t q = tl_ * cfg_.heads * cfg_.head_dim, kvr = kv * kv_rep_;
      return (cp_ - 1) * (2 * q + kvr) / cp_ * es;                 // dout in; dq, dk, dv out
    }
  }
  return 0;
}

}  // namespace hcp::cp
