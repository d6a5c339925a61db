// train_hybrid's checkpoints: parameters, AdamW moments, step and the loss history in one HDF5 file
// (/checkpoint/...), written collectively and read back on every rank.
#pragma once
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "io/results.hpp"
#include "model/optim.hpp"

namespace hcp::drivers {

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

}  // namespace hcp::drivers
