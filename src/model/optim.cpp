#include "model/optim.hpp"

#include <cmath>

#include "kernels/kernels.hpp"

namespace hcp::model {

double lr_at(const AdamWConfig& c, std::int64_t t) {
  if (c.warmup > 0 && t <= c.warmup) return c.lr * static_cast<double>(t) / static_cast<double>(c.warmup);
  const double span = static_cast<double>(std::max<std::int64_t>(c.total - c.warmup, 1));
  const double frac = std::min(1.0, static_cast<double>(t - c.warmup) / span);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * frac));
}

AdamW::AdamW(AdamWConfig cfg, const ParamMap& params) : c_(cfg) {
  m_ = zeros_like(params);
  v_ = zeros_like(params);
}

double AdamW::step(ParamMap& params, ParamMap& grads, bool (*skip)(const std::string&)) {
  // The update runs where the parameters live (host or GPU kernels, fp64 arithmetic either way).
  double sq = 0, sq_split = 0;
  for (auto& [n, g] : grads) {
    if (skip && skip(n)) continue;
    (split_.count(n) ? sq_split : sq) += kernels::sum_squares(g);
  }
  if (group_ && group_->size() > 1) group_->all_reduce(&sq_split, 1, DType::F64, ReduceOp::Sum);
  const double norm = std::sqrt(sq + sq_split);
  const double scale = c_.clip > 0 && norm > c_.clip ? c_.clip / norm : 1.0;
  ++t_;
  last_lr_ = lr_at(c_, t_);
  const double bc1 = 1 - std::pow(c_.beta1, static_cast<double>(t_)),
               bc2 = 1 - std::pow(c_.beta2, static_cast<double>(t_));
  for (auto& [n, p] : params) {
    if (skip && skip(n)) continue;
    Tensor& g = grads.at(n);
    HCP_CHECK(p.dtype() == g.dtype() && p.is_contiguous() && g.is_contiguous(), "AdamW: parameter ", n,
              " and its gradient must be contiguous and of one dtype");
    HCP_CHECK(p.dtype() == DType::F64 || p.dtype() == DType::F32, "AdamW: parameters must be fp32 or fp64 (", n, " is ",
              to_string(p.dtype()), ")");
    const kernels::AdamWStep st{last_lr_, c_.beta1, c_.beta2, bc1, bc2, c_.eps, p.dim() >= 2 ? c_.weight_decay : 0.0,
                                scale};
    kernels::adamw_update(p, g, m_.at(n), v_.at(n), st);
  }
  return norm;
}

}  // namespace hcp::model
