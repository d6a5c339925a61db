// Attention CP by Ulysses all-to-all, sequence shards to head shards and back: its strategy object,
// shape rule, byte and memory models and record.
#include <algorithm>

#include "core/memory_parts.hpp"
#include "cp/attention_bodies.hpp"
#include "cp/head_exchange.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

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

class A2AAttention final : public AttnImpl {
 public:
  explicit A2AAttention(AttnStep& s) : AttnImpl(s) {
    KvHeadRanges r = kv_head_ranges(s_.cfg.heads, s_.cfg.kv_heads, s_.cp, s_.rank);
    kv_lo_ = std::move(r.lo);
    kv_n_ = std::move(r.n);
    kv_map_ = std::move(r.map);
    // Each rank's K/V heads of every token, in global order: the inner exchange of a2a+p2p with the
    // whole group inside (one outer rank, whose DCS order at cp 1 is the global order).
    xkv_ = std::make_unique<HeadExchange>(s_.comm, kv_lo_, kv_n_,
                                          inner_to_outer_rows(s_.cfg.placement.global, s_.cp, s_.cp, s_.rank),
                                          s_.cfg.placement.global.total());
  }

  void forward(Tensor& o) override {
    PhaseTimes& c = s_.fwd_ph;
    c.start_laps(s_.q.space());
    const std::int64_t Hl = s_.cfg.heads / s_.cp;
    qh_ = seq_to_head(s_.comm, s_.q, s_.cfg.placement.global);
    kh_ = xkv_->to_heads(s_.k);
    vh_ = xkv_->to_heads(s_.v);
    c.lap("comm_wait");
    if (!kv_map_.empty()) {
      kh_ = expand_heads(kh_, kv_map_);
      vh_ = expand_heads(vh_, kv_map_);
    }
    auto p = s_.params(Hl, kh_.size(1));
    p.segments = k::segments_from_layout(s_.cfg.placement.global, s_.cfg.placement.global);
    oh_ = Tensor::zeros(qh_.shape(), s_.q.dtype());
    s_.lse = Tensor::zeros({s_.cfg.placement.global.total(), Hl}, lse_dtype(s_.q));
    k::attention_fwd(oh_, s_.lse, qh_, kh_, vh_, p);
    c.lap("compute");
    s_.o = head_to_seq(s_.comm, oh_, s_.cfg.placement.global);
    c.lap("comm_wait");
    o.copy_from(s_.o.view(o.shape()));
  }

  void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) override {
    PhaseTimes& c = s_.bwd_ph;
    c.start_laps(s_.q.space());
    const std::int64_t Hl = s_.cfg.heads / s_.cp, n = kv_n_[static_cast<std::size_t>(s_.rank)];
    Tensor doh = seq_to_head(s_.comm, dout, s_.cfg.placement.global);
    c.lap("comm_wait");
    auto p = s_.params(Hl, kh_.size(1));
    p.segments = k::segments_from_layout(s_.cfg.placement.global, s_.cfg.placement.global);
    Tensor dqh = zeros_like(qh_), dkh = zeros_like(kh_), dvh = zeros_like(vh_);
    k::attention_bwd(dqh, dkh, dvh, qh_, kh_, vh_, oh_, s_.lse, doh, p);
    if (!kv_map_.empty()) {
      dkh = expand_heads_adjoint(dkh, kv_map_, n);
      dvh = expand_heads_adjoint(dvh, kv_map_, n);
    }
    c.lap("compute");
    Tensor dql = head_to_seq(s_.comm, dqh, s_.cfg.placement.global);
    Tensor dkl = xkv_->to_tokens(dkh, s_.cfg.kv_heads), dvl = xkv_->to_tokens(dvh, s_.cfg.kv_heads);
    c.lap("comm_wait");
    dq.copy_from(dql.view(dq.shape()));
    dk.copy_from(dkl.view(dk.shape()));
    dv.copy_from(dvl.view(dv.shape()));
  }
  void release() override { release_saved(qh_, kh_, vh_, oh_); }

 private:
  // Rank r's query heads [r H/cp, (r+1) H/cp) read K/V heads [kv_lo_[r], kv_lo_[r] + kv_n_[r]);
  // exactly those travel. kv_map_ (empty when the local heads are plain GQA): the local K/V head of
  // each local query head, the received heads expanded to one per query head for the kernel.
  // xkv_ moves them: local [Tl, Hkv, D] -> [T, n_mine, D] in global order, and back, the gradients
  // of a K/V head that several ranks read summed at its owner.
  std::vector<std::int64_t> kv_lo_, kv_n_, kv_map_;
  std::unique_ptr<HeadExchange> xkv_;
  Tensor qh_, kh_, vh_, oh_;  // saved by forward: head-sharded, global order
};

void check_a2a_shape(const CpAttnConfig& cfg, int cp) {
  HCP_CHECK(cfg.heads % cp == 0, "a2a attention needs attention.heads (", cfg.heads, ") divisible by cp (", cp, ")");
}

// q in and o out (dout in and dq out): (cp-1)/cp of each; the K/V heads each other rank reads of
// this rank's tokens (backward: the gradients of this rank's K/V heads of every other rank's tokens).
std::int64_t a2a_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward) {
  const std::int64_t tl = local_layout(cfg.placement.global, cp).total(), D = cfg.head_dim, q = tl * cfg.heads * D;
  const std::vector<std::int64_t> n = kv_head_ranges(cfg.heads, cfg.kv_heads, cp, rank).n;
  std::int64_t heads_out = 0;
  for (int r = 0; r < cp; ++r) heads_out += r == rank ? 0 : n[static_cast<std::size_t>(r)];
  const std::int64_t kv_part = backward ? (cp - 1) * n[static_cast<std::size_t>(rank)] : heads_out;
  return ((cp - 1) * 2 * q / cp + 2 * tl * kv_part * D) * static_cast<std::int64_t>(dtype_size(dt));
}

// Memory: Q, O, dO, dQ in head layout (each the size of Q) with the all-to-all send/receive buffers
// of the largest of them, and the K/V heads this rank reads (and their gradients) over the whole
// sequence: n heads of cp x tl tokens.
std::int64_t a2a_work_bytes(const MemoryModel& m, const AttnMemShape& s) {
  const std::int64_t Q = m.mul(m.mul(s.tl, s.heads * s.head_dim), s.es);
  const std::int64_t lse = m.mul(s.tl, s.heads * acc_bytes(s.es));
  const std::int64_t hl = std::max<std::int64_t>(s.heads / s.cp, 1),
                     g = std::max<std::int64_t>(s.heads / std::max<std::int64_t>(s.kv_heads, 1), 1);
  std::int64_t n = 1;
  for (std::int64_t r = 0; r < s.cp; ++r) n = std::max(n, ((r + 1) * hl - 1) / g + 1 - r * hl / g);
  const std::int64_t KH = m.mul(m.mul(m.mul(s.tl, s.cp), n * s.head_dim), s.es);
  return m.sum(m.sum(m.mul(8, Q), m.mul(4, KH)), lse);
}

// The kernels read about kv_heads / cp + 1 K/V heads of every token.
std::int64_t a2a_kernel_elements(const MemoryModel& m, const AttnMemShape& s) {
  return m.sum(m.mul(m.mul(4, s.tl), s.heads * s.head_dim),
               m.mul(m.mul(4, m.mul(s.tl, s.cp)), s.head_dim * std::max<std::int64_t>(1, s.kv_heads / s.cp + 1)));
}

}  // namespace

const AttnStrategyInfo& a2a_strategy() {
  static const AttnStrategyInfo r{
      .id = AttnStrategy::A2A,
      .name = "a2a",
      .summary = "Ulysses all-to-all: heads/cp heads of every token (heads % cp == 0)",
      .check = check_a2a_shape,
      .make = [](AttnStep& s, std::shared_ptr<CpLevels>) -> std::unique_ptr<AttnImpl> {
        return std::make_unique<A2AAttention>(s);
      },
      .model_bytes = a2a_model_bytes,
      .work_bytes = a2a_work_bytes,
      .kernel_elements = a2a_kernel_elements,
      // q, k, v and o forward; dout, dq, dk and dv backward: eight all-to-alls
      .exchange_messages = [](int cp, int) { return 8 * static_cast<std::int64_t>(cp - 1); },
      .ring_ranks = [](int, int) { return 1; },
  };
  return r;
}

}  // namespace hcp::cp
