// AdamW with decoupled weight decay (on parameters of rank >= 2 only), a linear warm-up then cosine
// learning-rate schedule, and global gradient-norm clipping. Parameters and gradients are
// replicated on every CP rank (gradients already summed over the group), so every rank applies the
// same update and the replicas stay bitwise equal. A split parameter (a rank's experts) has its
// moments split the same way; its squares enter the global norm summed over the group that holds
// each part once.
#pragma once
#include <cstdint>
#include <set>
#include <string>

#include "comm/communicator.hpp"

#include "model/mamba2.hpp"

namespace hcp::model {

struct AdamWConfig {
  double lr = 3e-3, min_lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.01, clip = 1.0;
  std::int64_t warmup = 10, total = 100;
};

// Learning rate of step `t` (1-based): linear warm-up to lr over `warmup` steps, cosine to min_lr at `total`.
double lr_at(const AdamWConfig& c, std::int64_t t);

class AdamW {
 public:
  AdamW(AdamWConfig cfg, const ParamMap& params);
  // Clips `grads` in place to the global norm `clip` (0: off) and returns the norm before clipping.
  // Names for which `skip(name)` is true (buffers) are neither clipped nor updated.
  double step(ParamMap& params, ParamMap& grads, bool (*skip)(const std::string&));
  // `names` are split over the ranks of `group` (each part held by one rank of it).
  void set_split(std::set<std::string> names, Communicator* group) {
    split_ = std::move(names);
    group_ = group;
  }
  std::int64_t steps_done() const { return t_; }
  double last_lr() const { return last_lr_; }
  // State for checkpoints: first and second moments and the step counter.
  ParamMap& m() { return m_; }
  ParamMap& v() { return v_; }
  void set_steps_done(std::int64_t t) { t_ = t; }

 private:
  AdamWConfig c_;
  ParamMap m_, v_;
  std::set<std::string> split_;
  Communicator* group_ = nullptr;
  std::int64_t t_ = 0;
  double last_lr_ = 0;
};

}  // namespace hcp::model
