// The two companions of train_hybrid's CP model in a step: the precision of the weights (the model
// steps in the run's dtype from master weights kept in fp32 for a bf16 run, its gradients widened
// back before the update) and the cp=1 replica on rank 0, which trains the whole batch in lock step
// from the same initial weights so that its loss curve checks the CP one.
#pragma once
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "hybrid_common.hpp"
#include "model/hybrid.hpp"
#include "model/optim.hpp"
#include "train_io.hpp"

namespace hcp::drivers {

// Master weights in `master` (fp32 for a bf16 run, else the run's dtype), the step in `dt`.
struct MasterWeights {
  DType dt, master;
  explicit MasterWeights(DType run) : dt(run), master(run == DType::BF16 ? DType::F32 : run) {}
  // The weights the model steps with: the master weights themselves, or a copy in dt.
  model::ParamMap compute(const model::ParamMap& p) const {
    if (master == dt) return p;
    model::ParamMap c;
    for (const auto& [n, t] : p) c[n] = t.to(dt);
    return c;
  }
  // Gradients in the master dtype, for the update.
  void widen(model::ParamMap& g) const {
    for (auto& [n, t] : g)
      if (t.dtype() != master) t = t.to(master);
  }
};

// The cp=1 replica: every expert on its one rank (ep 1), its own AdamW. Resumes from the CP run's
// checkpoint like the CP run.
class Replica {
 public:
  Replica(Communicator& self, const model::HybridConfig& cfg, const MasterWeights& mw, const model::AdamWConfig& opt,
          std::uint64_t seed, Space space, const std::string& resume)
      : self_(self), cfg_(cfg), mw_(mw) {
    cfg_.ep = 1;
    p_ = in_space(model::hybrid_init(cfg_, mw_.master, seed), space);
    opt_ = std::make_unique<model::AdamW>(opt, p_);
    std::vector<double> unused;  // the checkpoint's loss history is the CP run's
    if (!resume.empty()) read_checkpoint(resume, p_, *opt_, unused, nullptr);
  }
  // One step on the whole batch; its loss. routing() then holds its expert choices.
  double step(const TokenBatch& b) {
    model::HybridModel m(self_, cfg_, b.layout);
    model::ParamMap g;
    const double loss = m.step(mw_.compute(p_), b.tokens, b.labels, g).loss;
    routing_.clear();
    for (const Tensor& r : m.routing())  // [T, K] per MoE block: the real tokens, global order
      routing_.push_back(b.layout.padded() ? cp::take_rows(host(r), cp::real_rows(b.layout)) : host(r));
    mw_.widen(g);
    opt_->step(p_, g, model::is_buffer);
    return loss;
  }
  const std::vector<Tensor>& routing() const { return routing_; }

 private:
  Communicator& self_;
  model::HybridConfig cfg_;
  MasterWeights mw_;
  model::ParamMap p_;
  std::unique_ptr<model::AdamW> opt_;
  std::vector<Tensor> routing_;
};

}  // namespace hcp::drivers
