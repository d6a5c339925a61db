// AdamW update and the sum of squares for gradient-norm clipping on the host (CUDA twin:
// kernels/cuda/optim.cu).
#include <cmath>
#include <initializer_list>

#include "kernels/host/common.hpp"
#include "kernels/host/host_kernels.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels {
namespace {
using host::In;
using host::Range;
}  // namespace

double host::sum_squares(const Tensor& x) {
  double sq = 0;
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x");
    const T* xb = x_.get();
    for (std::int64_t i = 0; i < x.numel(); ++i) sq += static_cast<double>(xb[i]) * static_cast<double>(xb[i]);
  });
  return sq;
}

void host::adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s) {
  HCP_DISPATCH_FLOAT(p, {
    T *pb = p.data<T>(), *mb = m.data<T>(), *vb = v.data<T>();
    const T* gb = g.data<T>();
    Kokkos::parallel_for("adamw", Range(0, p.numel()), [&](std::int64_t i) {
      const double gi = static_cast<double>(gb[i]) * s.grad_scale;
      const double mi = s.beta1 * static_cast<double>(mb[i]) + (1 - s.beta1) * gi;
      const double vi = s.beta2 * static_cast<double>(vb[i]) + (1 - s.beta2) * gi * gi;
      mb[i] = static_cast<T>(mi);
      vb[i] = static_cast<T>(vi);
      const double upd = (mi / s.bc1) / (std::sqrt(vi / s.bc2) + s.eps) + s.weight_decay * static_cast<double>(pb[i]);
      pb[i] = static_cast<T>(static_cast<double>(pb[i]) - s.lr * upd);
    });
  });
}

}  // namespace hcp::kernels
