#include "model/optim.hpp"

#include <cmath>

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

namespace {
template <class T>
void update(T* p, const T* g, T* m, T* v, std::int64_t n, double lr, double b1, double b2, double bc1, double bc2,
            double eps, double wd, double scale) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double gi = static_cast<double>(g[i]) * scale;
    const double mi = b1 * static_cast<double>(m[i]) + (1 - b1) * gi;
    const double vi = b2 * static_cast<double>(v[i]) + (1 - b2) * gi * gi;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    const double upd = (mi / bc1) / (std::sqrt(vi / bc2) + eps) + wd * static_cast<double>(p[i]);
    p[i] = static_cast<T>(static_cast<double>(p[i]) - lr * upd);
  }
}
}  // namespace

double AdamW::step(ParamMap& params, ParamMap& grads, bool (*skip)(const std::string&)) {
  double sq = 0;
  for (auto& [n, g] : grads) {
    if (skip && skip(n)) continue;
    for (std::int64_t i = 0; i < g.numel(); ++i) sq += g.get(i) * g.get(i);
  }
  const double norm = std::sqrt(sq);
  const double scale = c_.clip > 0 && norm > c_.clip ? c_.clip / norm : 1.0;
  ++t_;
  last_lr_ = lr_at(c_, t_);
  const double bc1 = 1 - std::pow(c_.beta1, static_cast<double>(t_)), bc2 = 1 - std::pow(c_.beta2, static_cast<double>(t_));
  for (auto& [n, p] : params) {
    if (skip && skip(n)) continue;
    Tensor& g = grads.at(n);
    const double wd = p.dim() >= 2 ? c_.weight_decay : 0.0;
    HCP_CHECK(p.dtype() == g.dtype() && p.is_contiguous() && g.is_contiguous(), "AdamW: parameter ", n,
              " and its gradient must be contiguous and of one dtype");
    if (p.dtype() == DType::F64)
      update(p.data<double>(), g.data<double>(), m_.at(n).data<double>(), v_.at(n).data<double>(), p.numel(), last_lr_,
             c_.beta1, c_.beta2, bc1, bc2, c_.eps, wd, scale);
    else if (p.dtype() == DType::F32)
      update(p.data<float>(), g.data<float>(), m_.at(n).data<float>(), v_.at(n).data<float>(), p.numel(), last_lr_,
             c_.beta1, c_.beta2, bc1, bc2, c_.eps, wd, scale);
    else
      throw Error("AdamW: parameters must be fp32 or fp64 (" + n + " is " + to_string(p.dtype()) + ")");
  }
  return norm;
}

}  // namespace hcp::model
