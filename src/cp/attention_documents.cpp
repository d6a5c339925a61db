// CpAttention's strategy object on a per-document placement (cp/documents.hpp): whole documents attended locally,
// the split ones as a CP problem of their own.
#include "cp/attention_bodies.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

// Rows [0, W) hold whole documents: the kernels on them alone, nothing sent. Rows [W, Tl) are this
// rank's chunks of the split documents: their own CP attention (any strategy) on those rows.
CpAttnConfig split_documents_config(const CpAttnConfig& cfg) {
  HCP_CHECK(cfg.placement.docs, "split_documents_config: no per-document placement");
  CpAttnConfig s = cfg;
  s.placement = Placement::dcs(cfg.placement.docs->split, cfg.placement.cp);
  return s;
}

namespace {
class DocumentsAttention final : public AttnImpl {
 public:
  DocumentsAttention(AttnStep& s, std::shared_ptr<CpLevels> levels) : AttnImpl(s) {
    if (s.cfg.placement.docs->split.nseq() > 0)
      split_ = std::make_unique<CpAttention>(s.comm, split_documents_config(s.cfg), std::move(levels));
  }
  const CpAttention* nested() const override { return split_.get(); }
  const CpLevels* levels() const override { return split_ ? split_->levels() : nullptr; }

  void forward(Tensor& o) override {
    PhaseTimes& c = s_.fwd_ph;
    c.start_laps(s_.q.space());
    const std::int64_t W = s_.local.total(), S = s_.tl - W;
    s_.o = Tensor::zeros(s_.q.shape(), s_.q.dtype());
    s_.lse = Tensor::zeros({s_.tl, s_.cfg.heads}, lse_dtype(s_.q));
    if (W > 0) {
      auto p = s_.params(s_.cfg.heads, s_.cfg.kv_heads);
      p.segments = k::segments_from_layout(s_.local, s_.local);
      Tensor ow = s_.o.slice(0, 0, W), lw = s_.lse.slice(0, 0, W);
      k::attention_fwd(ow, lw, s_.q.slice(0, 0, W), s_.k.slice(0, 0, W), s_.v.slice(0, 0, W), p);
    }
    c.lap("compute");
    if (split_) {
      Tensor os = s_.o.slice(0, W, S);
      split_->forward(os, s_.q.slice(0, W, S), s_.k.slice(0, W, S), s_.v.slice(0, W, S));
    }
    o.copy_from(s_.o.view(o.shape()));
  }

  void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) override {
    PhaseTimes& c = s_.bwd_ph;
    c.start_laps(s_.q.space());
    const std::int64_t W = s_.local.total(), S = s_.tl - W;
    Tensor dql = zeros_like(s_.q), dkl = zeros_like(s_.k), dvl = zeros_like(s_.v);
    if (W > 0) {
      auto p = s_.params(s_.cfg.heads, s_.cfg.kv_heads);
      p.segments = k::segments_from_layout(s_.local, s_.local);
      Tensor a = dql.slice(0, 0, W), b = dkl.slice(0, 0, W), d = dvl.slice(0, 0, W);
      k::attention_bwd(a, b, d, s_.q.slice(0, 0, W), s_.k.slice(0, 0, W), s_.v.slice(0, 0, W), s_.o.slice(0, 0, W),
                       s_.lse.slice(0, 0, W), dout.slice(0, 0, W), p);
    }
    c.lap("compute");
    if (split_) {
      Tensor a = dql.slice(0, W, S), b = dkl.slice(0, W, S), d = dvl.slice(0, W, S);
      split_->backward(a, b, d, dout.slice(0, W, S));
    }
    dq.copy_from(dql.view(dq.shape()));
    dk.copy_from(dkl.view(dk.shape()));
    dv.copy_from(dvl.view(dv.shape()));
  }

 private:
  // the split documents' own CP attention over rows [Tl - S, Tl) (null when none is split)
  std::unique_ptr<CpAttention> split_;
};
}  // namespace

std::unique_ptr<AttnImpl> make_documents_attention(AttnStep& s, std::shared_ptr<CpLevels> levels) {
  return std::make_unique<DocumentsAttention>(s, std::move(levels));
}

}  // namespace hcp::cp
