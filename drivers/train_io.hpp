// train_hybrid's files: checkpoints (parameters, AdamW moments, step and the loss history under
// /checkpoint/, written collectively and read back on every rank) and the per-step series and final
// parameters of the results file (/train/*, /params/*).
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "io/results.hpp"
#include "model/optim.hpp"

namespace hcp::drivers {

// Parameters are checked where they leave the run (checkpoint, results): an update can overflow
// them while the loss and gradient norm of its step were finite.
inline void require_finite(const model::ParamMap& p, std::int64_t step) {
  for (const auto& [n, t] : p) {
    const Tensor h = t.to(Space::Host);
    for (std::int64_t i = 0; i < h.numel(); ++i)
      HCP_CHECK(std::isfinite(h.get(i)), "step ", step, ": parameter '", n, "' element ", i, " is ", h.get(i),
                " (not finite) after the update; lower train.lr or enable train.clip");
  }
}

inline void write_checkpoint(Communicator& world, const std::string& path, model::ParamMap& p, model::AdamW& opt,
                      const std::vector<double>& loss, const std::vector<double>& ref_loss) {
  ResultsWriter w(path, world);
  w.tensor("/checkpoint/step", Tensor::from({static_cast<double>(opt.steps_done())}, {1}, DType::F64), "scalar", "steps");
  for (auto& [n, t] : p) w.tensor("/checkpoint/params/" + n, t, "parameter shape", "1");
  for (auto& [n, t] : opt.m()) w.tensor("/checkpoint/adam_m/" + n, t, "parameter shape", "1");
  for (auto& [n, t] : opt.v()) w.tensor("/checkpoint/adam_v/" + n, t, "parameter shape", "1");
  w.tensor("/checkpoint/loss", Tensor::from(loss, {static_cast<std::int64_t>(loss.size())}, DType::F64), "[step]", "nats");
  if (!ref_loss.empty())
    w.tensor("/checkpoint/loss_reference", Tensor::from(ref_loss, {static_cast<std::int64_t>(ref_loss.size())}, DType::F64),
             "[step]", "nats");
  w.finish();
}

inline void read_checkpoint(const std::string& path, model::ParamMap& p, model::AdamW& opt, std::vector<double>& loss,
                     std::vector<double>* ref_loss) {
  ResultsReader r(path);
  const auto step = static_cast<std::int64_t>(r.read("/checkpoint/step").get(0));
  for (auto& [n, t] : p) {
    t.copy_from(r.read("/checkpoint/params/" + n, t.dtype()).view(t.shape()));
    opt.m().at(n).copy_from(r.read("/checkpoint/adam_m/" + n, t.dtype()).view(t.shape()));
    opt.v().at(n).copy_from(r.read("/checkpoint/adam_v/" + n, t.dtype()).view(t.shape()));
  }
  opt.set_steps_done(step);
  loss = r.read("/checkpoint/loss").to_vector();
  if (ref_loss && r.exists("/checkpoint/loss_reference")) *ref_loss = r.read("/checkpoint/loss_reference").to_vector();
}

struct TrainSeries {
  std::vector<double> loss, loss_reference;             // every step since step 1 (a resumed run continues them)
  std::vector<double> lr, grad_norm, label_tokens, step_ms;  // this run's steps
};
inline void write_train_results(ResultsWriter& w, const TrainSeries& s, const model::ParamMap& p, bool with_ref, double worst,
                                double rtol, bool pass) {
  auto vec = [](const std::vector<double>& v) { return Tensor::from(v, {static_cast<std::int64_t>(v.size())}, DType::F64); };
  w.tensor("/train/loss", vec(s.loss), "[step] (all steps since step 1)", "nats");
  if (with_ref) {
    w.tensor("/train/loss_reference", vec(s.loss_reference), "[step] cp=1 replica", "nats");
    w.summary("train/loss", worst, worst, rtol, pass);
  }
  w.tensor("/train/lr", vec(s.lr), "[step] (this run)", "1");
  w.tensor("/train/grad_norm", vec(s.grad_norm), "[step] (this run), before clipping", "1");
  w.tensor("/train/label_tokens", vec(s.label_tokens), "[step] (this run)", "tokens");
  w.timings("train/step", s.step_ms);
  for (auto& [n, t] : p) w.tensor("/params/" + n, t, "parameter shape (final)", "1");
}

}  // namespace hcp::drivers
