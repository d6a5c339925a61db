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
  split_rows_ = docs->split_local();
  tl_ = whole_rows_ + split_rows_;
  self_ = comm_.split_blocks(1);
  if (whole_rows_ > 0)  // at cp = 1 either strategy is the plain layer
    whole_ = make_mamba2(strategy_, *self_, c_, docs->whole[static_cast<std::size_t>(rank_)]);
  if (const SeqLayout* split = placement_.cp_layout()) split_ = make_mamba2(strategy_, comm_, c_, *split);
}

void Mamba2Docs::forward(Tensor& y, const Tensor& h, const ParamMap& p) {
  HCP_CHECK(h.numel() == tl_ * c_.hidden && y.numel() == h.numel(), "mamba: input must be [", tl_, ", ", c_.hidden,
            "] local tokens (this rank's documents)");
  const Tensor hv = h.view({tl_, c_.hidden});
  Tensor yv = y.view({tl_, c_.hidden});
  if (whole_) {
    Tensor yw = yv.slice(0, 0, whole_rows_);
    whole_->forward(yw, hv.slice(0, 0, whole_rows_), p);
  }
  if (split_) {
    Tensor ys = yv.slice(0, whole_rows_, split_rows_);
    split_->forward(ys, hv.slice(0, whole_rows_, split_rows_), p);
  }
}

void Mamba2Docs::backward(Tensor& dh, ParamMap& grads, const Tensor& dy, const ParamMap& p) {
  const Tensor dyv = dy.view({tl_, c_.hidden});
  Tensor dhv = dh.view({tl_, c_.hidden});
  // The split part first: its collectives run on every rank in the same order.
  ParamMap gs, gw;
  if (split_) {
    Tensor d = dhv.slice(0, whole_rows_, split_rows_);
    split_->backward(d, gs, dyv.slice(0, whole_rows_, split_rows_), p);
  }
  if (whole_) {
    Tensor d = dhv.slice(0, 0, whole_rows_);
    whole_->backward(d, gw, dyv.slice(0, 0, whole_rows_), p);
  } else {
    gw = zeros_like(split_ ? gs : p);  // nothing whole here: this rank adds zeros to the sum
  }
  phases_.time("bwd/param_allreduce", default_space(), [&] {
    for (auto& [n, g] : gw) {
      reduce_grad(comm_, g);  // the whole documents' sums over the group
      if (split_) kernels::axpy(g, 1.0, gs.at(n));
    }
  });
  grads = std::move(gw);
}

const std::map<std::string, double>& Mamba2Docs::phase_ms() const {
  ms_ = phases_.totals();
  for (const Mamba2Layer* part : {whole_.get(), split_.get()})
    if (part)
      for (const auto& [n, v] : part->phase_ms()) ms_[n] += v;
  return ms_;
}

const std::map<std::string, PhaseTimes::Peak>& Mamba2Docs::phase_peaks() const {
  peaks_ = phases_.peaks();
  for (const Mamba2Layer* part : {whole_.get(), split_.get()})
    if (part)
      for (const auto& [n, v] : part->phase_peaks())
        if (v.bytes > peaks_[n].bytes) peaks_[n] = v;
  return peaks_;
}

void Mamba2Docs::reset_phases() {
  phases_.reset();
  if (whole_) whole_->reset_phases();
  if (split_) split_->reset_phases();
}

std::int64_t mamba_cp_model_bytes(MambaCp strategy, const Mamba2Config& c, const cp::Placement& placement, int rank,
                                  DType dt) {
  const SeqLayout* l = placement.cp_layout();
  if (placement.cp == 1 || !l) return 0;
  return mamba_cp_model_bytes(strategy, c, *l, placement.cp, rank, dt);
}

}  // namespace hcp::model
