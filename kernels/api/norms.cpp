// The kernel API for RMSNorm and gated group RMSNorm: each entry point checks its shapes, then routes the
// call by the tensors' memory space (kernels/api/route.hpp).
#include <vector>

#include "kernels/api/route.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::require_numel;
void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  const std::int64_t C = w.numel();
  HCP_CHECK(C > 0 && x.numel() % C == 0, "rmsnorm: x ", shape_str(x.shape()), " is not [M, C=", C, "]");
  const std::int64_t M = x.numel() / C;
  require_numel(y, x.numel(), "rmsnorm_fwd: y");
  require_numel(rstd, M, "rmsnorm_fwd: rstd");
  HCP_ROUTE(x, rmsnorm_fwd, y, rstd, x, w, eps);
}

void rmsnorm_bwd(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy) {
  const std::int64_t C = w.numel();
  HCP_CHECK(C > 0 && x.numel() % C == 0, "rmsnorm: x ", shape_str(x.shape()), " is not [M, C=", C, "]");
  const std::int64_t M = x.numel() / C;
  require_numel(dx, x.numel(), "rmsnorm_bwd: dx");
  require_numel(dw, C, "rmsnorm_bwd: dw");
  require_numel(rstd, M, "rmsnorm_bwd: rstd");
  require_numel(dy, x.numel(), "rmsnorm_bwd: dy");
  HCP_ROUTE(x, rmsnorm_bwd, dx, dw, x, w, rstd, dy);
}

void gated_rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w, std::int64_t groups,
                       double eps) {
  const std::int64_t C = w.numel();
  HCP_CHECK(groups > 0 && C % groups == 0, "gated_rmsnorm: groups (", groups, ") must divide channels (", C, ")");
  HCP_CHECK(C > 0 && x.numel() % C == 0 && z.numel() == x.numel(), "gated_rmsnorm: x ", shape_str(x.shape()), " / z ",
            shape_str(z.shape()), " are not [M, C=", C, "]");
  const std::int64_t M = x.numel() / C;
  require_numel(y, x.numel(), "gated_rmsnorm_fwd: y");
  require_numel(rstd, M * groups, "gated_rmsnorm_fwd: rstd [M,G]");
  HCP_ROUTE(x, gated_rmsnorm_fwd, y, rstd, x, z, w, groups, eps);
}

void gated_rmsnorm_bwd(Tensor& dx, Tensor& dz, Tensor& dw, const Tensor& x, const Tensor& z, const Tensor& w,
                       const Tensor& rstd, std::int64_t groups, const Tensor& dy) {
  const std::int64_t C = w.numel();
  HCP_CHECK(groups > 0 && C % groups == 0, "gated_rmsnorm: groups (", groups, ") must divide channels (", C, ")");
  HCP_CHECK(C > 0 && x.numel() % C == 0 && z.numel() == x.numel(), "gated_rmsnorm: x / z are not [M, C]");
  const std::int64_t M = x.numel() / C;
  require_numel(dx, x.numel(), "gated_rmsnorm_bwd: dx");
  require_numel(dz, x.numel(), "gated_rmsnorm_bwd: dz");
  require_numel(dw, C, "gated_rmsnorm_bwd: dw");
  require_numel(rstd, M * groups, "gated_rmsnorm_bwd: rstd");
  require_numel(dy, x.numel(), "gated_rmsnorm_bwd: dy");
  HCP_ROUTE(x, gated_rmsnorm_bwd, dx, dz, dw, x, z, w, rstd, groups, dy);
}

}  // namespace hcp::kernels
