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
  HCP_CHECK(cfg.placement.cp == cp, "attention CP layout: rows placed over ", cfg.placement.cp, " ranks, run on ", cp);
  if (cfg.placement.docs) {
    const SeqLayout u = cfg.placement.global.unpadded();
    bool same = u.nseq() == static_cast<std::int64_t>(cfg.placement.docs->lens.size());
    for (std::int64_t s = 0; same && s < u.nseq(); ++s)
      same = u.len(s) == cfg.placement.docs->lens[static_cast<std::size_t>(s)];
    HCP_CHECK(same, "attention CP layout: the documents placed are not the sequences of the layout");
  } else {
    require_dcs_divisible(cfg.placement.global, cp, "attention CP layout");
  }
  if (const auto check = attn_strategy_info(cfg.strategy).check) check(cfg, cp);
}

CpAttention::CpAttention(Communicator& comm, CpAttnConfig cfg, std::shared_ptr<CpLevels> levels)
    : s_(std::make_unique<AttnStep>(comm, std::move(cfg))) {
  AttnStep& s = *s_;
  check_attention_cp_shape(s.cfg, s.cp);
  if (s.cfg.placement.docs) {
    s.local = s.cfg.placement.docs->whole[static_cast<std::size_t>(s.rank)];
    s.tl = s.cfg.placement.docs->local_rows(s.rank);
    impl_ = make_documents_attention(s, std::move(levels));
    return;
  }
  s.local = local_layout(s.cfg.placement.global, s.cp);
  s.tl = s.local.total();
  impl_ = s.cp == 1 ? make_local_attention(s) : attn_strategy_info(s.cfg.strategy).make(s, std::move(levels));
}

CpAttention::~CpAttention() = default;

const CpLevels* CpAttention::levels() const { return impl_->levels(); }

void CpAttention::forward(Tensor& o, const Tensor& q, const Tensor& kk, const Tensor& v) {
  SpaceScope space_scope(q.space());  // work tensors live where the inputs do
  AttnStep& s = *s_;
  const std::int64_t H = s.cfg.heads, Hkv = s.cfg.kv_heads, D = s.cfg.head_dim, tl = s.tl;
  HCP_CHECK(q.numel() == tl * H * D, "cp attention: q has shape ", shape_str(q.shape()), ", expected [", tl, ", ", H,
            ", ", D, "] (local tokens = global / cp)");
  HCP_CHECK(kk.numel() == tl * Hkv * D && v.numel() == kk.numel(), "cp attention: k/v must be [", tl, ", ", Hkv, ", ",
            D, "]");
  HCP_CHECK(o.numel() == q.numel(), "cp attention: o must match q");
  s.q = q.view({tl, H, D});
  s.k = kk.view({tl, Hkv, D});
  s.v = v.view({tl, Hkv, D});
  s.fwd_ph.reset();
  impl_->forward(o);
}

void CpAttention::backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  SpaceScope space_scope(dout.space());  // work tensors live where the inputs do
  AttnStep& s = *s_;
  HCP_CHECK(s.o.defined(), "cp attention: backward() before forward()");
  HCP_CHECK(dout.numel() == s.q.numel() && dq.numel() == s.q.numel() && dk.numel() == s.k.numel() &&
                dv.numel() == s.v.numel(),
            "cp attention backward: gradient shapes do not match the forward's inputs");
  s.bwd_ph.reset();
  impl_->backward(dq, dk, dv, dout.view(s.q.shape()));
  release();
}

void CpAttention::release() {
  AttnStep& s = *s_;
  release_saved(s.q, s.k, s.v, s.o, s.lse);
  impl_->release();
}

// ---- one rank --------------------------------------------------------------------------------
namespace {
// cp = 1, whatever the strategy: the kernels on the local tensors (the whole problem), with no ring,
// gather or all-to-all and no staging copy; the gradients are written in place.
class LocalAttention final : public AttnImpl {
 public:
  using AttnImpl::AttnImpl;
  void forward(Tensor& o) override {
    PhaseTimes& c = s_.fwd_ph;
    c.start_laps(s_.q.space());
    auto p = s_.params(s_.cfg.heads, s_.cfg.kv_heads);
    p.segments = k::segments_from_layout(s_.cfg.placement.global, s_.cfg.placement.global);
    s_.o = Tensor::zeros(s_.q.shape(), s_.q.dtype());
    s_.lse = Tensor::zeros({s_.tl, s_.cfg.heads}, lse_dtype(s_.q));
    k::attention_fwd(s_.o, s_.lse, s_.q, s_.k, s_.v, p);
    o.copy_from(s_.o.view(o.shape()));
    c.lap("compute");
  }
  void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) override {
    PhaseTimes& c = s_.bwd_ph;
    c.start_laps(s_.q.space());
    auto p = s_.params(s_.cfg.heads, s_.cfg.kv_heads);
    p.segments = k::segments_from_layout(s_.cfg.placement.global, s_.cfg.placement.global);
    if (dq.is_contiguous() && dk.is_contiguous() && dv.is_contiguous()) {
      Tensor dqv = dq.view(s_.q.shape()), dkv = dk.view(s_.k.shape()), dvv = dv.view(s_.v.shape());
      k::attention_bwd(dqv, dkv, dvv, s_.q, s_.k, s_.v, s_.o, s_.lse, dout, p);
    } else {
      Tensor dql = zeros_like(s_.q), dkl = zeros_like(s_.k), dvl = zeros_like(s_.v);
      k::attention_bwd(dql, dkl, dvl, s_.q, s_.k, s_.v, s_.o, s_.lse, dout, p);
      dq.copy_from(dql.view(dq.shape()));
      dk.copy_from(dkl.view(dk.shape()));
      dv.copy_from(dvl.view(dv.shape()));
    }
    c.lap("compute");
  }
};
}  // namespace

std::unique_ptr<AttnImpl> make_local_attention(AttnStep& s) { return std::make_unique<LocalAttention>(s); }

namespace {
// A pass's laps, plus `ring` (a2a+p2p: its ring's own split; zeros otherwise).
CpAttnTimes times_of(const PhaseTimes& ph, const std::vector<CpAttnTimes>& nested) {
  const auto& t = ph.totals();
  const auto s = [&](const char* k) { return t.count(k) ? t.at(k) / 1e3 : 0.0; };
  CpAttnTimes out{s("compute"), s("comm_wait")};
  for (const CpAttnTimes& n : nested) {
    out.compute += n.compute;
    out.comm_wait += n.comm_wait;
  }
  return out;
}
}  // namespace

CpAttnTimes CpAttention::fwd_times() const {
  std::vector<CpAttnTimes> sub;
  for (const CpAttention* n : impl_->nested()) sub.push_back(n->fwd_times());
  return times_of(s_->fwd_ph, sub);
}
CpAttnTimes CpAttention::bwd_times() const {
  std::vector<CpAttnTimes> sub;
  for (const CpAttention* n : impl_->nested()) sub.push_back(n->bwd_times());
  return times_of(s_->bwd_ph, sub);
}

std::int64_t CpAttention::model_fwd_bytes(DType dt) const {
  return attention_cp_model_bytes(s_->cfg, s_->cp, s_->rank, dt, false);
}
std::int64_t CpAttention::model_bwd_bytes(DType dt) const {
  return attention_cp_model_bytes(s_->cfg, s_->cp, s_->rank, dt, true);
}

std::int64_t attention_cp_model_bytes(const CpAttnConfig& cfg, int cp, int rank, DType dt, bool backward) {
  if (cp == 1) return 0;  // one rank runs locally
  // per-document placement: whole documents send nothing; the split ones are CP problems of their own
  if (cfg.placement.docs) {
    std::int64_t n = 0;
    for (const CpPart& p : cfg.placement.cp_parts(rank))
      if (!p.empty()) n += attention_cp_model_bytes(part_config(cfg, p), p.placement.cp, p.rank, dt, backward);
    return n;
  }
  return attn_strategy_info(cfg.strategy).model_bytes(cfg, cp, rank, dt, backward);
}

}  // namespace hcp::cp
