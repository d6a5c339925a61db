// The kernel API for AdamW and the sum of squares for clipping: each entry point checks its shapes, then routes the
// call by the tensors' memory space (kernels/api/route.hpp).
#include <vector>

#include "kernels/api/route.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels {
double sum_squares(const Tensor& x) { return HCP_ROUTE(x, sum_squares, x); }

void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s) {
  HCP_CHECK(p.dtype() == DType::F64 || p.dtype() == DType::F32, "adamw_update: parameters must be fp32 or fp64, got ",
            to_string(p.dtype()));
  for (const Tensor* t : std::initializer_list<const Tensor*>{&g, &m, &v})
    HCP_CHECK(t->dtype() == p.dtype() && t->numel() == p.numel() && t->is_contiguous() && t->space() == p.space(),
              "adamw_update: gradient and moments must match the parameter (dtype, size, memory space, contiguous)");
  HCP_CHECK(p.is_contiguous(), "adamw_update: the parameter must be contiguous");
  HCP_ROUTE(p, adamw_update, p, g, m, v, s);
}

}  // namespace hcp::kernels
