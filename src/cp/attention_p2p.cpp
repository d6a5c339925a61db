// Attention CP by ring p2p with DualChunkSwap: its strategy object, byte and memory models and record.
#include <algorithm>
#include <cmath>

#include "core/memory_parts.hpp"
#include "cp/attention_bodies.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

namespace {
// Segments of ring step i (K/V from rank j = r - i), per sequence, by the DualChunkSwap rules: the
// diagonal block causal; K/V of an earlier rank: all queries against its first K/V half; of a later
// rank: the second query half against all its K/V. Pads (at the end of a sequence, so a suffix of
// every rank's rows: cp::local_real) are neither queries nor keys.
std::vector<k::AttnSegment> ring_segments(const SeqLayout& global, const SeqLayout& local, int cp, int r, int j,
                                          bool causal) {
  std::vector<k::AttnSegment> segs;
  for (std::int64_t s = 0; s < local.nseq(); ++s) {
    const std::int64_t lo = local.cu_seqlens[s], n = local.len(s), half = n / 2;
    const std::int64_t rq = local_real(global, s, cp, r), rk = local_real(global, s, cp, j);
    if (!causal || j == r) {
      keep_segment(segs, {lo, rq, lo, rk, 0, 0});  // j == r with causal: local order is increasing
    } else if (j < r) {
      keep_segment(segs, {lo, rq, lo, std::min(half, rk), 0, 0});  // all Q vs the first K/V chunk (c_j), no mask
    } else {
      keep_segment(segs, {lo + half, rq - half, lo, rk, 0, 0});  // second Q chunk vs all K/V, no mask
    }
  }
  return segs;
}

// The ring: K/V blocks travel to the next rank each step, merged into the output by LSE; the
// backward's dK/dV accumulator travels one step behind them to the blocks' owners. It keeps no state
// beyond AttnStep's saved tensors.
class P2PAttention final : public AttnImpl {
 public:
  using AttnImpl::AttnImpl;

  void forward(Tensor& o) override {
    const DType dt = s_.q.dtype(), acc_dt = lse_dtype(s_.q);
    const std::int64_t H = s_.cfg.heads, D = s_.cfg.head_dim;
    // K and V travel together in one buffer [2, Tl, Hkv, D]; double buffered. The output is merged in
    // fp32 for bf16 (fp64/fp32 otherwise) and rounded once at the end, as the cp=1 kernel does.
    Tensor cur = ring_kv_buffer(), nxt = Tensor::empty(cur.shape(), dt);
    Tensor oacc = Tensor::zeros({s_.tl, H, D}, acc_dt);
    s_.lse = Tensor::zeros({s_.tl, H}, acc_dt);
    s_.lse.fill(-INFINITY);
    Tensor op = Tensor::zeros({s_.tl, H, D}, dt), lp = Tensor::zeros({s_.tl, H}, acc_dt);
    PhaseTimes& c = s_.fwd_ph;
    c.start_laps(s_.q.space());
    for (int i = 0; i < s_.cp; ++i) {
      RingRequest req = ring_post_next(cur, nxt, i);
      c.lap("");
      const auto p = ring_params(i);
      Tensor kb = ring_half(cur, 0), vb = ring_half(cur, 1);
      k::attention_fwd(op, lp, s_.q, kb, vb, p);
      k::attention_merge(oacc, s_.lse, op, lp);
      c.lap("compute");
      if (req.active) {
        s_.comm.ring_wait(req);
        c.lap("comm_wait");
        std::swap(cur, nxt);
      }
    }
    s_.o = acc_dt == dt ? oacc : oacc.to(dt);
    o.copy_from(s_.o.view(o.shape()));
  }

  void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) override {
    const DType dt = s_.q.dtype(), acc_dt = lse_dtype(s_.q);
    const std::int64_t H = s_.cfg.heads, Hkv = s_.cfg.kv_heads, D = s_.cfg.head_dim;
    // K/V travel as in the forward. Their gradient accumulator [2, Tl, Hkv, D] (fp32 for bf16, so it
    // is rounded once, at its owner) travels one step behind: the accumulator of the block held at
    // step i arrives while step i computes, is waited for after it, and goes on to the next rank;
    // after the last step it reaches the block's owner.
    Tensor cur = ring_kv_buffer(), nxt = Tensor::empty(cur.shape(), dt);
    Tensor acc = Tensor::zeros({2, s_.tl, Hkv, D}, acc_dt), acc_in = Tensor::zeros({2, s_.tl, Hkv, D}, acc_dt);
    Tensor dq_acc = Tensor::zeros({s_.tl, H, D}, acc_dt), dq_p = Tensor::zeros({s_.tl, H, D}, dt);
    Tensor dk_p = Tensor::zeros({s_.tl, Hkv, D}, dt), dv_p = Tensor::zeros({s_.tl, Hkv, D}, dt);
    RingRequest ra;  // the accumulator in flight
    PhaseTimes& c = s_.bwd_ph;
    c.start_laps(s_.q.space());
    for (int i = 0; i < s_.cp; ++i) {
      RingRequest req = ring_post_next(cur, nxt, i);
      c.lap("");
      const auto p = ring_params(i);
      Tensor kb = ring_half(cur, 0), vb = ring_half(cur, 1);
      k::attention_bwd(dq_p, dk_p, dv_p, s_.q, kb, vb, s_.o, s_.lse, dout, p);
      k::axpy(dq_acc, 1.0, dq_p);
      c.lap("compute");
      if (ra.active) {  // this block's accumulator, from the previous rank
        s_.comm.ring_wait(ra);
        std::swap(acc, acc_in);
        c.lap("comm_wait");
      }
      Tensor ak = ring_half(acc, 0), av = ring_half(acc, 1);
      k::axpy(ak, 1.0, dk_p);
      k::axpy(av, 1.0, dv_p);
      c.lap("compute");
      ra = ring_post_next(acc, acc_in, -1, 9);  // on to the next rank (after the last step: the owner)
      if (req.active) {
        s_.comm.ring_wait(req);
        std::swap(cur, nxt);
        c.lap("comm_wait");
      }
    }
    s_.comm.ring_wait(ra);
    std::swap(acc, acc_in);
    c.lap("comm_wait");
    const auto out = [&](const Tensor& t) { return acc_dt == dt ? t : t.to(dt); };
    dq.copy_from(out(dq_acc).view(dq.shape()));
    dk.copy_from(out(acc.slice(0, 0, 1)).view(dk.shape()));
    dv.copy_from(out(acc.slice(0, 1, 1)).view(dv.shape()));
  }

 private:
  Tensor ring_half(const Tensor& buf, int j) const {  // K (j = 0) or V (1) of a K-then-V buffer
    return buf.slice(0, j, 1).view({s_.tl, s_.cfg.kv_heads, s_.cfg.head_dim});
  }

  // The [2, Tl, Hkv, D] K-then-V buffer that travels, holding this rank's K/V.
  Tensor ring_kv_buffer() const {
    const std::int64_t Hkv = s_.cfg.kv_heads, D = s_.cfg.head_dim;
    Tensor buf = Tensor::empty({2, s_.tl, Hkv, D}, s_.k.dtype());
    ring_half(buf, 0).copy_from(s_.k);
    ring_half(buf, 1).copy_from(s_.v);
    return buf;
  }

  k::AttnParams ring_params(int i) const {
    const int j = ((s_.rank - i) % s_.cp + s_.cp) % s_.cp;  // owner of the K/V held at step i
    auto p = s_.params(s_.cfg.heads, s_.cfg.kv_heads);
    p.mask = (s_.cfg.causal && i == 0) ? k::Mask::Causal : k::Mask::None;
    p.segments = ring_segments(s_.cfg.placement.global, s_.local, s_.cp, s_.rank, j, s_.cfg.causal);
    return p;
  }

  // Sends `send` to the next rank and receives into `recv` from the previous one, unless step i is
  // the last K/V step (a negative step always posts: the dK/dV accumulator moves after every step).
  RingRequest ring_post_next(Tensor& send, Tensor& recv, int i, int tag = 7) {
    if (i >= 0 && i + 1 >= s_.cp) return {};
    return s_.comm.ring_post(send.raw(), recv.raw(), send.numel(), send.dtype(), (s_.rank + 1) % s_.cp,
                             (s_.rank - 1 + s_.cp) % s_.cp, tag);
  }
};

}  // namespace

namespace {
// cp-1 ring steps of the local K/V; the backward adds the dK/dV accumulator's ring (fp32 for bf16).
std::int64_t p2p_model_bytes(const CpAttnConfig& cfg, int cp, int /*rank*/, DType dt, bool backward) {
  const std::int64_t tl = local_layout(cfg.placement.global, cp).total(), kv = 2 * tl * cfg.kv_heads * cfg.head_dim;
  const auto es = static_cast<std::int64_t>(dtype_size(dt));
  const auto acc_es = static_cast<std::int64_t>(dtype_size(acc_dtype(dt)));
  return backward ? (cp - 1) * kv * es + cp * kv * acc_es : (cp - 1) * kv * es;
}

// Memory (Q = tl H D, KV = tl Hkv D elements; "a" in the accumulation dtype): the saved o and LSE,
// the fp32 output merge (op, oacc) / the dQ accumulator and partial, the K/V double buffers (cur,
// nxt) with the partial dK/dV, and the travelling dK/dV accumulator pair.
std::int64_t p2p_work_bytes(const MemoryModel& m, const AttnMemShape& s) {
  const std::int64_t acc = acc_bytes(s.es);
  const std::int64_t Q = m.mul(m.mul(s.tl, s.heads * s.head_dim), s.es),
                     KV = m.mul(m.mul(s.tl, s.kv_heads * s.head_dim), s.es);
  const std::int64_t Qa = Q / s.es * acc, KVa = KV / s.es * acc, lse = m.mul(s.tl, s.heads * acc);
  return m.sum(m.sum(2 * Q + Qa, m.mul(6, KV)), m.sum(m.mul(4, KVa), 2 * lse));
}

// The kernels read one K/V block of tl tokens at a time: q, o, dout, dq and k, v, dk, dv of tl tokens
// (also the local kernels' elements at cp = 1).
std::int64_t p2p_kernel_elements(const MemoryModel& m, const AttnMemShape& s) {
  return m.sum(m.mul(m.mul(4, s.tl), s.heads * s.head_dim), m.mul(m.mul(4, s.tl), s.kv_heads * s.head_dim));
}

}  // namespace

const AttnStrategyInfo& p2p_strategy() {
  static const AttnStrategyInfo r{
      .id = AttnStrategy::P2P,
      .name = "p2p",
      .summary = "ring of K/V blocks with DualChunkSwap; dK/dV accumulators follow",
      .check = nullptr,
      .make = [](AttnStep& s, std::shared_ptr<CpLevels>) -> std::unique_ptr<AttnImpl> {
        return std::make_unique<P2PAttention>(s);
      },
      .model_bytes = p2p_model_bytes,
      .work_bytes = p2p_work_bytes,
      .kernel_elements = p2p_kernel_elements,
      .exchange_messages = [](int, int) -> std::int64_t { return 0; },
      .ring_ranks = [](int cp, int) { return cp; },
  };
  return r;
}

}  // namespace hcp::cp
