// CpAttention's strategy object on a per-document placement (cp/documents.hpp): whole documents attended locally,
// the split ones as a CP problem of their own.
#include <numeric>

#include "cp/attention_bodies.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

// Rows [0, W) hold whole documents: the kernels on them alone, nothing sent. The rows after them are
// this rank's chunks of the split documents, one part per group size (Placement::cp_parts): each its
// own CP attention (any strategy) over the communicator of its block of ranks.
CpAttnConfig part_config(const CpAttnConfig& cfg, const CpPart& part) {
  CpAttnConfig s = cfg;
  s.placement = part.placement;
  s.cp_inner = std::gcd(cfg.cp_inner, part.placement.cp);
  return s;
}

namespace {
class DocumentsAttention final : public AttnImpl {
 public:
  DocumentsAttention(AttnStep& s, std::shared_ptr<CpLevels> levels) : AttnImpl(s), levels_(std::move(levels)) {
    for (CpPart& p : s.cfg.placement.cp_parts(s.rank)) parts_.push_back(Part{std::move(p), nullptr});
  }
  std::vector<const CpAttention*> nested() const override {
    std::vector<const CpAttention*> out;
    for (const Part& p : parts_)
      if (p.attn) out.push_back(p.attn.get());
    return out;
  }
  const CpLevels* levels() const override {
    for (const Part& p : parts_)
      if (p.attn && p.at.whole_group(s_.cp)) return p.attn->levels();
    return nullptr;
  }

  void forward(Tensor& o) override {
    PhaseTimes& c = s_.fwd_ph;
    c.start_laps(s_.q.space());
    const std::int64_t W = s_.local.total();
    s_.o = Tensor::zeros(s_.q.shape(), s_.q.dtype());
    s_.lse = Tensor::zeros({s_.tl, s_.cfg.heads}, lse_dtype(s_.q));
    if (W > 0) {
      auto p = s_.params(s_.cfg.heads, s_.cfg.kv_heads);
      p.segments = k::segments_from_layout(s_.local, s_.local);
      Tensor ow = s_.o.slice(0, 0, W), lw = s_.lse.slice(0, 0, W);
      k::attention_fwd(ow, lw, s_.q.slice(0, 0, W), s_.k.slice(0, 0, W), s_.v.slice(0, 0, W), p);
    }
    c.lap("compute");
    make_parts();
    for (Part& p : parts_)
      if (p.attn) {
        const std::int64_t a = p.at.offset, n = p.at.rows;
        Tensor os = s_.o.slice(0, a, n);
        p.attn->forward(os, s_.q.slice(0, a, n), s_.k.slice(0, a, n), s_.v.slice(0, a, n));
      }
    o.copy_from(s_.o.view(o.shape()));
  }

  void backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) override {
    PhaseTimes& c = s_.bwd_ph;
    c.start_laps(s_.q.space());
    const std::int64_t W = s_.local.total();
    Tensor dql = zeros_like(s_.q), dkl = zeros_like(s_.k), dvl = zeros_like(s_.v);
    if (W > 0) {
      auto p = s_.params(s_.cfg.heads, s_.cfg.kv_heads);
      p.segments = k::segments_from_layout(s_.local, s_.local);
      Tensor a = dql.slice(0, 0, W), b = dkl.slice(0, 0, W), d = dvl.slice(0, 0, W);
      k::attention_bwd(a, b, d, s_.q.slice(0, 0, W), s_.k.slice(0, 0, W), s_.v.slice(0, 0, W), s_.o.slice(0, 0, W),
                       s_.lse.slice(0, 0, W), dout.slice(0, 0, W), p);
    }
    c.lap("compute");
    for (Part& p : parts_)
      if (p.attn) {
        const std::int64_t a = p.at.offset, n = p.at.rows;
        Tensor x = dql.slice(0, a, n), y = dkl.slice(0, a, n), z = dvl.slice(0, a, n);
        p.attn->backward(x, y, z, dout.slice(0, a, n));
      }
    dq.copy_from(dql.view(dq.shape()));
    dk.copy_from(dkl.view(dk.shape()));
    dv.copy_from(dvl.view(dv.shape()));
  }

 private:
  struct Part {
    CpPart at;
    std::unique_ptr<CpAttention> attn;  // null until the first forward, and on a block with no document
  };
  // Each part's attention over its block (at the first forward: a block's communicator is made then,
  // every rank asking for every group size in the same order).
  void make_parts() {
    for (Part& p : parts_) {
      if (p.attn) continue;
      Communicator& comm = s_.comm.block_of(p.at.placement.cp);
      if (!p.at.empty())
        p.attn =
            std::make_unique<CpAttention>(comm, part_config(s_.cfg, p.at), p.at.whole_group(s_.cp) ? levels_ : nullptr);
    }
  }
  std::shared_ptr<CpLevels> levels_;  // a2a+p2p's groups over the whole CP group, when given
  std::vector<Part> parts_;
};
}  // namespace

std::unique_ptr<AttnImpl> make_documents_attention(AttnStep& s, std::shared_ptr<CpLevels> levels) {
  return std::make_unique<DocumentsAttention>(s, std::move(levels));
}

}  // namespace hcp::cp
