// CUDA AdamW update and the sum of squares for gradient-norm clipping (host twin:
// kernels/host/optim.cpp). The sum has a fixed grid and fixed strides: bitwise repeatable.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels::cuda_impl {
using namespace hcp::cuda;

namespace {
constexpr int kThreads = 256;

// Fixed grid and fixed per-thread strides: the partial sums, and so the result, never change.
constexpr int kSqBlocks = 256;
template <class S>
__global__ void sumsq_k(double* part, const S* x, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const double v = static_cast<double>(ld(x + i));
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
template <class S>
__global__ void adamw_k(S* p, const S* g, S* m, S* v, std::int64_t n, AdamWStep s) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const double gi = static_cast<double>(g[i]) * s.grad_scale;
  const double mi = s.beta1 * static_cast<double>(m[i]) + (1 - s.beta1) * gi;
  const double vi = s.beta2 * static_cast<double>(v[i]) + (1 - s.beta2) * gi * gi;
  m[i] = static_cast<S>(mi);
  v[i] = static_cast<S>(vi);
  const double upd = (mi / s.bc1) / (sqrt(vi / s.bc2) + s.eps) + s.weight_decay * static_cast<double>(p[i]);
  p[i] = static_cast<S>(static_cast<double>(p[i]) - s.lr * upd);
}
}  // namespace

double sum_squares(const Tensor& x) {
  require_cuda(x, "sum_squares");
  if (x.numel() == 0) return 0;
  const DeviceArray<double> part(nullptr, kSqBlocks);
  HCP_CUDA_DISPATCH(x, sumsq_k<S><<<kSqBlocks, kThreads>>>(part.p, dptr<S>(x), x.numel()));
  check_launch("sum_squares");
  std::vector<double> h(kSqBlocks);
  HCP_CUDA_CHECK(cudaMemcpy(h.data(), part.p, kSqBlocks * sizeof(double), cudaMemcpyDeviceToHost));
  double sq = 0;
  for (double v : h) sq += v;
  return sq;
}

void adamw_update(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWStep& s) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&p, &g, &m, &v}) require_cuda(*t, "adamw_update");
  const std::int64_t n = p.numel();
  if (n == 0) return;
  if (p.dtype() == DType::F64)
    adamw_k<double><<<blocks_for(n, kThreads), kThreads>>>(dptr<double>(p), dptr<double>(g), dptr<double>(m),
                                                           dptr<double>(v), n, s);
  else
    adamw_k<float>
        <<<blocks_for(n, kThreads), kThreads>>>(dptr<float>(p), dptr<float>(g), dptr<float>(m), dptr<float>(v), n, s);
  check_launch("adamw_update");
}

}  // namespace hcp::kernels::cuda_impl
