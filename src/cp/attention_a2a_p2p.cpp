// Attention CP over two levels, a2a+p2p (Ulysses over the inner group, the p2p ring over the outer
// group): its strategy object, shape rule, byte and memory models and record.
#include <algorithm>

#include "core/memory_parts.hpp"
#include "cp/attention_bodies.hpp"
#include "cp/head_exchange.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {

namespace {
// The K/V heads inner rank `me` carries around the ring with its `hl` query heads: those of their
// GQA groups, or one per query head where its block does not follow the groups.
std::int64_t ring_kv_heads_of(std::int64_t heads, std::int64_t kv_heads, int inner, int me, std::int64_t hl) {
  const KvHeadRanges r = kv_head_ranges(heads, kv_heads, inner, me);
  return r.map.empty() ? r.n[static_cast<std::size_t>(me)] : hl;
}
}  // namespace

CpAttnConfig a2a_p2p_ring_config(const CpAttnConfig& cfg, int rank) {
  const int inner = cfg.cp_inner, me = rank % inner;
  CpAttnConfig rc = cfg;
  rc.strategy = AttnStrategy::P2P;
  rc.heads = cfg.heads / inner;
  rc.kv_heads = ring_kv_heads_of(cfg.heads, cfg.kv_heads, inner, me, rc.heads);
  rc.cp_inner = 1;
  rc.placement = Placement::dcs(cfg.placement.global, cfg.placement.cp / inner);
  return rc;
}

namespace {
void check_a2a_p2p_shape(const CpAttnConfig& cfg, int cp) {
  if (cp == 1) return;  // one rank runs the local kernels
  HCP_CHECK(cfg.cp_inner >= 1 && cp % cfg.cp_inner == 0, "a2a+p2p attention needs parallel.cp_inner (", cfg.cp_inner,
            ") to divide the CP size (", cp, ")");
  HCP_CHECK(cfg.heads % cfg.cp_inner == 0, "a2a+p2p attention needs attention.heads (", cfg.heads,
            ") divisible by parallel.cp_inner (", cfg.cp_inner, ")");
}

// Rank r is inner rank r % inner of outer rank r / inner. The inner all-to-all gives each rank
// heads / inner query heads (and the K/V heads they read) of all its outer rank's tokens, placed in
// DCS order at cp / inner: the union of the inner ranks' DCS shards is exactly the outer rank's
// DCS shard. The ring over the outer group is then the p2p strategy on those tensors.
class A2AP2PAttention final : public AttnImpl {
 public:
  A2AP2PAttention(AttnStep& s, std::shared_ptr<CpLevels> levels) : AttnImpl(s), levels_(std::move(levels)) {
    inner_ = s_.cfg.cp_inner;
    KvHeadRanges r = kv_head_ranges(s_.cfg.heads, s_.cfg.kv_heads, inner_, s_.rank % inner_);
    kv_lo_ = std::move(r.lo);
    kv_n_ = std::move(r.n);
    kv_map_ = std::move(r.map);
    HCP_CHECK(!levels_ || levels_->inner == inner_, "a2a+p2p: levels of inner size ", levels_ ? levels_->inner : 0,
              " given to a layer of parallel.cp_inner ", inner_);
  }
  std::vector<const CpAttention*> nested() const override {
    return ring_ ? std::vector<const CpAttention*>{ring_.get()} : std::vector<const CpAttention*>{};
  }
  const CpLevels* levels() const override { return levels_.get(); }

  void forward(Tensor& o) override {
    make_levels();
    PhaseTimes& c = s_.fwd_ph;
    c.start_laps(s_.q.space());
    const std::int64_t hl = s_.cfg.heads / inner_, D = s_.cfg.head_dim;
    Tensor qh = xq_->to_heads(s_.q), kh = xkv_->to_heads(s_.k), vh = xkv_->to_heads(s_.v);
    if (!kv_map_.empty()) {
      kh = expand_heads(kh, kv_map_);
      vh = expand_heads(vh, kv_map_);
    }
    c.lap("comm_wait");
    Tensor oh = Tensor::zeros({inner_ * s_.tl, hl, D}, s_.q.dtype());
    ring_->forward(oh, qh, kh, vh);
    c.lap("");
    s_.o = xq_->to_tokens(oh, s_.cfg.heads);
    c.lap("comm_wait");
    o.copy_from(s_.o.view(o.shape()));
  }

  void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) override {
    PhaseTimes& c = s_.bwd_ph;
    c.start_laps(s_.q.space());
    const std::int64_t hl = s_.cfg.heads / inner_, D = s_.cfg.head_dim, kvr = ring_kv_heads();
    Tensor doh = xq_->to_heads(dout);
    c.lap("comm_wait");
    Tensor dqh = Tensor::zeros({inner_ * s_.tl, hl, D}, s_.q.dtype()),
           dkh = Tensor::zeros({inner_ * s_.tl, kvr, D}, s_.q.dtype()),
           dvh = Tensor::zeros({inner_ * s_.tl, kvr, D}, s_.q.dtype());
    ring_->backward(dqh, dkh, dvh, doh);
    c.lap("");
    if (!kv_map_.empty()) {
      const std::int64_t n = kv_n_[static_cast<std::size_t>(s_.rank % inner_)];
      dkh = expand_heads_adjoint(dkh, kv_map_, n);
      dvh = expand_heads_adjoint(dvh, kv_map_, n);
    }
    c.lap("compute");
    Tensor dql = xq_->to_tokens(dqh, s_.cfg.heads), dkl = xkv_->to_tokens(dkh, s_.cfg.kv_heads),
           dvl = xkv_->to_tokens(dvh, s_.cfg.kv_heads);
    c.lap("comm_wait");
    dq.copy_from(dql.view(dq.shape()));
    dk.copy_from(dkl.view(dk.shape()));
    dv.copy_from(dvl.view(dv.shape()));
  }

 private:
  // K/V heads per rank on the outer ring
  std::int64_t ring_kv_heads() const {
    return kv_map_.empty() ? kv_n_[static_cast<std::size_t>(s_.rank % inner_)] : s_.cfg.heads / inner_;
  }
  // The inner and outer groups, the exchanges and the ring (collective, once).
  void make_levels() {
    if (ring_) return;
    if (!levels_) levels_ = CpLevels::make(s_.comm, inner_);
    Communicator& inner_comm = *levels_->inner_comm;
    const std::int64_t hl = s_.cfg.heads / inner_;
    std::vector<std::int64_t> qlo, qn;
    for (int j = 0; j < inner_; ++j) {
      qlo.push_back(j * hl);
      qn.push_back(hl);
    }
    const auto rows = inner_to_outer_rows(s_.cfg.placement.global, s_.cp, inner_, s_.rank);
    xq_ = std::make_unique<HeadExchange>(inner_comm, qlo, qn, rows, inner_ * s_.tl);
    xkv_ = std::make_unique<HeadExchange>(inner_comm, kv_lo_, kv_n_, rows, inner_ * s_.tl);
    ring_ = std::make_unique<CpAttention>(*levels_->outer_comm, a2a_p2p_ring_config(s_.cfg, s_.rank));
  }

  int inner_ = 1;
  // kv_lo_ / kv_n_ / kv_map_: as a2a's over the inner group (query heads [j hl, (j+1) hl) of inner
  // rank j read K/V heads [kv_lo_[j], kv_lo_[j] + kv_n_[j]); kv_map_ expands them per query head
  // where the block does not follow the GQA groups); xq_ and xkv_ move query and K/V heads over the
  // inner group; ring_ is the p2p ring over the outer group on the head-sharded tensors.
  std::vector<std::int64_t> kv_lo_, kv_n_, kv_map_;
  std::shared_ptr<CpLevels> levels_;
  std::unique_ptr<HeadExchange> xq_, xkv_;
  std::unique_ptr<CpAttention> ring_;
};
}  // namespace

std::int64_t a2a_p2p_ring_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward) {
  if (cfg.placement.docs) {
    std::int64_t n = 0;
    for (const CpPart& p : cfg.placement.cp_parts(rank))
      if (!p.empty()) n += a2a_p2p_ring_bytes(part_config(cfg, p), p.placement.cp, p.rank, dt, backward);
    return n;
  }
  const int inner = cfg.cp_inner;
  return attention_cp_model_bytes(a2a_p2p_ring_config(cfg, rank), cp / inner, rank / inner, dt, backward);
}

namespace {
// Inner: as a2a over the inner ranks (the other query heads of this rank's tokens out, their outputs
// back, and the K/V heads the other inner ranks read); outer: the p2p ring's own model.
std::int64_t a2a_p2p_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward) {
  check_a2a_p2p_shape(cfg, cp);
  const std::int64_t tl = local_layout(cfg.placement.global, cp).total(), D = cfg.head_dim, H = cfg.heads;
  const int inner = cfg.cp_inner, me = rank % inner;
  const std::vector<std::int64_t> n = kv_head_ranges(H, cfg.kv_heads, inner, me).n;
  std::int64_t heads_out = 0;
  for (int j = 0; j < inner; ++j) heads_out += j == me ? 0 : n[static_cast<std::size_t>(j)];
  const std::int64_t kv_part = backward ? (inner - 1) * n[static_cast<std::size_t>(me)] : heads_out;
  const std::int64_t a2a =
      (2 * tl * (H - H / inner) * D + 2 * tl * kv_part * D) * static_cast<std::int64_t>(dtype_size(dt));
  return a2a + a2a_p2p_ring_bytes(cfg, cp, rank, dt, backward);
}

}  // namespace

std::int64_t a2a_p2p_ring_kv_heads(std::int64_t heads, std::int64_t kv_heads, int inner) {
  const std::int64_t hl = std::max<std::int64_t>(heads / inner, 1);
  std::int64_t kvr = 1;
  for (int j = 0; j < inner; ++j) kvr = std::max(kvr, ring_kv_heads_of(heads, kv_heads, inner, j, hl));
  return kvr;
}

namespace {
// The ring's sizes: cp / inner ranks of inner x tl tokens, heads / inner query heads, their K/V heads.
AttnMemShape ring_shape(const MemoryModel& m, const AttnMemShape& s, int inner) {
  AttnMemShape r = s;
  r.cp = s.cp / inner;
  r.tl = m.mul(s.tl, inner);
  r.heads = std::max<std::int64_t>(s.heads / inner, 1);
  r.kv_heads = a2a_p2p_ring_kv_heads(s.heads, s.kv_heads, inner);
  r.inner = 1;
  return r;
}

// Memory: the inner exchange's q, o, dout, dq in head layout (each the size of Q) with the
// all-to-all buffers of the largest, the ring's K/V heads and their gradients (inner x tl tokens),
// the exchanges' results back in token layout; then the ring's own buffers on those tensors.
std::int64_t a2a_p2p_work_bytes(const MemoryModel& m, const AttnMemShape& s) {
  const int inner = std::max(s.inner, 1);
  const AttnMemShape r = ring_shape(m, s, inner);
  const std::int64_t Q = m.mul(m.mul(s.tl, s.heads * s.head_dim), s.es),
                     KV = m.mul(m.mul(s.tl, s.kv_heads * s.head_dim), s.es);
  const std::int64_t KH = m.mul(m.mul(r.tl, r.kv_heads * s.head_dim), s.es);
  const std::int64_t own = m.sum(m.sum(m.mul(8, Q), m.mul(4, KH)), 2 * KV);
  return m.sum(own, attention_work_bytes(m, AttnStrategy::P2P, r));
}

// The ring's kernels on inner x tl tokens: heads / inner query heads and their K/V heads.
std::int64_t a2a_p2p_kernel_elements(const MemoryModel& m, const AttnMemShape& s) {
  const AttnMemShape r = ring_shape(m, s, std::max(s.inner, 1));
  return m.sum(m.mul(m.mul(4, s.tl), s.heads * s.head_dim), m.mul(m.mul(4, r.tl), r.kv_heads * s.head_dim));
}

}  // namespace

const AttnStrategyInfo& a2a_p2p_strategy() {
  static const AttnStrategyInfo r{
      .id = AttnStrategy::A2A_P2P,
      .name = "a2a+p2p",
      .summary = "Ulysses over parallel.cp_inner ranks, ring p2p over cp/cp_inner groups (heads % cp_inner == 0)",
      .check = check_a2a_p2p_shape,
      .make = [](AttnStep& s, std::shared_ptr<CpLevels> levels) -> std::unique_ptr<AttnImpl> {
        return std::make_unique<A2AP2PAttention>(s, std::move(levels));
      },
      .model_bytes = a2a_p2p_model_bytes,
      .work_bytes = a2a_p2p_work_bytes,
      .kernel_elements = a2a_p2p_kernel_elements,
      // a2a's eight exchanges over the inner group; the ring over the outer group
      .exchange_messages = [](int, int inner) { return 8 * static_cast<std::int64_t>(inner - 1); },
      .ring_ranks = [](int cp, int inner) { return cp / inner; },
      .two_level = true,
  };
  return r;
}

}  // namespace hcp::cp
