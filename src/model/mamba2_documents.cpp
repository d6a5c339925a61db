// Mamba2Docs: the Mamba2 mixer on a per-document placement (model/mamba2.hpp).
#include "kernels/kernels.hpp"
#include "model/layers.hpp"
#include "model/mamba2.hpp"

namespace hcp::model {

Mamba2Docs::Mamba2Docs(MambaCp strategy, Communicator& comm, Mamba2Config cfg, cp::Placement placement)
    : Mamba2Layer(comm, cfg), strategy_(strategy), placement_(std::move(placement)) {
  const cp::DocPartition* docs = placement_.docs.get();
  HCP_CHECK(docs && docs->cp == cp_, "mamba: documents placed over ", docs ? docs->cp : 0, " ranks, run on ", cp_);
  whole_rows_ = docs->whole_rows(rank_);
  tl_ = docs->local_rows(rank_);
  Communicator& self = comm_.block_of(1);  // collective at its first call: every rank asks
  if (whole_rows_ > 0)                     // at cp = 1 either strategy is the plain layer
    whole_ = make_mamba2(strategy_, self, c_, docs->whole[static_cast<std::size_t>(rank_)]);
  // Every rank asks for every block size in the same order (block_of is collective at its first call).
  for (cp::CpPart& at : placement_.cp_parts(rank_)) {
    Communicator& block = comm_.block_of(at.placement.cp);
    Part part{std::move(at), nullptr};
    if (!part.at.empty()) part.layer = make_mamba2(strategy_, block, c_, part.at.placement.global);
    parts_.push_back(std::move(part));
  }
}

std::vector<const Mamba2Layer*> Mamba2Docs::layers() const {
  std::vector<const Mamba2Layer*> out;
  if (whole_) out.push_back(whole_.get());
  for (const Part& p : parts_)
    if (p.layer) out.push_back(p.layer.get());
  return out;
}

void Mamba2Docs::drop_saved() {
  Mamba2Layer::drop_saved();
  if (whole_) whole_->drop_saved();
  for (Part& q : parts_)
    if (q.layer) q.layer->drop_saved();
}

void Mamba2Docs::forward(Tensor& y, const Tensor& h, const ParamMap& p) {
  HCP_CHECK(h.numel() == tl_ * c_.hidden && y.numel() == h.numel(), "mamba: input must be [", tl_, ", ", c_.hidden,
            "] local tokens (this rank's documents)");
  HCP_CHECK(!keep_carry_,
            "generation hands off Mamba2 states from a DualChunkSwap prefill only (data.partition = "
            "\"dcs\")");
  const Tensor hv = h.view({tl_, c_.hidden});
  Tensor yv = y.view({tl_, c_.hidden});
  if (whole_) {
    Tensor yw = yv.slice(0, 0, whole_rows_);
    whole_->forward(yw, hv.slice(0, 0, whole_rows_), p);
  }
  for (Part& part : parts_)
    if (part.layer) {
      Tensor ys = yv.slice(0, part.at.offset, part.at.rows);
      part.layer->forward(ys, hv.slice(0, part.at.offset, part.at.rows), p);
    }
}

void Mamba2Docs::backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p) {
  const Tensor dyv = dy.view({tl_, c_.hidden});
  Tensor dhv = dh.view({tl_, c_.hidden});
  // The split parts first: their collectives run on every rank of a block in the same order. Each
  // part's gradients are its block's sums, the same on every rank of the block.
  std::vector<ParamMap> gs(parts_.size());
  const ParamMap* shapes = &p;
  for (std::size_t i = 0; i < parts_.size(); ++i)
    if (Part& part = parts_[i]; part.layer) {
      Tensor d = dhv.slice(0, part.at.offset, part.at.rows);
      part.layer->backward(d, gs[i], dyv.slice(0, part.at.offset, part.at.rows), p);
      shapes = &gs[i];
    }
  ParamMap gw;
  if (whole_) {
    Tensor d = dhv.slice(0, 0, whole_rows_);
    whole_->backward(d, gw, dyv.slice(0, 0, whole_rows_), p);
  } else {
    gw = zeros_like(*shapes);  // nothing whole here: this rank adds zeros to the sum
  }
  phases_.time("bwd/param_allreduce", default_space(), [&] {
    for (auto& [n, g] : gw) {
      // a sub-group's sums enter the group's once, from the block's first rank
      for (std::size_t i = 0; i < parts_.size(); ++i)
        if (parts_[i].layer && !parts_[i].at.whole_group(cp_) && parts_[i].at.rank == 0)
          kernels::axpy(g, 1.0, gs[i].at(n));
      reduce_grad(comm_, g);  // the whole documents' (and sub-groups') sums over the group
      for (std::size_t i = 0; i < parts_.size(); ++i)
        if (parts_[i].layer && parts_[i].at.whole_group(cp_)) kernels::axpy(g, 1.0, gs[i].at(n));
    }
  });
  grads = std::move(gw);
}

const std::map<std::string, double>& Mamba2Docs::phase_ms() const {
  ms_ = phases_.totals();
  for (const Mamba2Layer* part : layers())
    for (const auto& [n, v] : part->phase_ms()) ms_[n] += v;
  return ms_;
}

const std::map<std::string, PhaseTimes::Peak>& Mamba2Docs::phase_peaks() const {
  peaks_ = phases_.peaks();
  for (const Mamba2Layer* part : layers())
    for (const auto& [n, v] : part->phase_peaks())
      if (v.bytes > peaks_[n].bytes) peaks_[n] = v;
  return peaks_;
}

void Mamba2Docs::reset_phases() {
  phases_.reset();
  if (whole_) whole_->reset_phases();
  for (Part& part : parts_)
    if (part.layer) part.layer->reset_phases();
}

std::int64_t mamba_cp_model_bytes(MambaCp strategy, const Mamba2Config& c, const cp::Placement& placement, int rank,
                                  DType dt, bool forward_only) {
  if (placement.cp == 1) return 0;
  std::int64_t n = 0;
  for (const cp::CpPart& p : placement.cp_parts(rank))
    if (!p.empty())
      n += mamba_cp_model_bytes(strategy, c, p.placement.global, p.placement.cp, p.rank, dt, cp::Partition::DCS,
                                forward_only);
  return n;
}

}  // namespace hcp::model
