// CUDA RMSNorm and gated group RMSNorm, forward and backward (host twin: kernels/host/norms.cpp).
// Every reduction has a fixed order (block reductions, one owner per output): bitwise repeatable.
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

// ---- RMSNorm ------------------------------------------------------------------------------------
template <class S>
__global__ void rmsnorm_fwd_k(S* y, S* rstd, const S* x, const S* w, std::int64_t C, double eps) {
  using A = typename Acc<S>::type;
  const std::int64_t m = blockIdx.x;
  const S* xr = x + m * C;
  A ss = 0;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A v = ld(xr + c);
    ss += v * v;
  }
  ss = block_sum(ss);
  const A r = A(1) / sqrt(ss / A(C) + A(eps));
  if (threadIdx.x == 0) st(rstd + m, r);
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) st(y + m * C + c, ld(xr + c) * r * ld(w + c));
}
// 16-byte vectors; each thread keeps its first kKeep vectors in registers between the two passes
// (C up to kKeep·V·blockDim elements is read once), later ones are read again.
constexpr int kKeep = 4;
template <class S>
__global__ void rmsnorm_fwd_vec_k(S* y, S* rstd, const S* x, const S* w, std::int64_t C, double eps) {
  using A = typename Acc<S>::type;
  constexpr int V = kVec<S>;
  const std::int64_t nv = C / V;
  const S* xr = x + blockIdx.x * C;
  S* yr = y + blockIdx.x * C;
  A keep[kKeep][V];
  A ss = 0;
#pragma unroll
  for (int n = 0; n < kKeep; ++n) {
    const std::int64_t i = threadIdx.x + static_cast<std::int64_t>(n) * blockDim.x;
    if (i < nv) {
      ld_vec<S>(keep[n], xr + i * V);
#pragma unroll
      for (int e = 0; e < V; ++e) ss += keep[n][e] * keep[n][e];
    }
  }
  for (std::int64_t i = threadIdx.x + static_cast<std::int64_t>(kKeep) * blockDim.x; i < nv; i += blockDim.x) {
    A v[V];
    ld_vec<S>(v, xr + i * V);
#pragma unroll
    for (int e = 0; e < V; ++e) ss += v[e] * v[e];
  }
  ss = block_sum(ss);
  const A r = A(1) / sqrt(ss / A(C) + A(eps));
  if (threadIdx.x == 0) st(rstd + blockIdx.x, r);
  auto out = [&](std::int64_t i, A (&v)[V]) {
    A wv[V];
    ld_vec<S>(wv, w + i * V);
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = v[e] * r * wv[e];
    st_vec<S>(yr + i * V, v);
  };
#pragma unroll
  for (int n = 0; n < kKeep; ++n) {
    const std::int64_t i = threadIdx.x + static_cast<std::int64_t>(n) * blockDim.x;
    if (i < nv) out(i, keep[n]);
  }
  for (std::int64_t i = threadIdx.x + static_cast<std::int64_t>(kKeep) * blockDim.x; i < nv; i += blockDim.x) {
    A v[V];
    ld_vec<S>(v, xr + i * V);
    out(i, v);
  }
}
template <class S>
__global__ void rmsnorm_bwd_dx_k(S* dx, const S* x, const S* w, const S* rstd, const S* dy, std::int64_t C) {
  using A = typename Acc<S>::type;
  const std::int64_t m = blockIdx.x;
  const A r = ld(rstd + m);
  A dot = 0;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += ld(dy + m * C + c) * ld(w + c) * ld(x + m * C + c);
  dot = block_sum(dot);
  const A k = r * r * r * dot / A(C);
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x)
    st(dx + m * C + c, r * ld(dy + m * C + c) * ld(w + c) - ld(x + m * C + c) * k);
}
// Column sums: one thread per channel, rows in order (coalesced across the warp).
template <class S>
__global__ void rmsnorm_bwd_dw_k(S* dw, const S* x, const S* rstd, const S* dy, std::int64_t M, std::int64_t C,
                                 std::int64_t groups) {
  using A = typename Acc<S>::type;
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const std::int64_t g = c / (C / groups);
  A acc = 0;
  for (std::int64_t m = 0; m < M; ++m) acc += ld(dy + m * C + c) * ld(x + m * C + c) * ld(rstd + m * groups + g);
  st(dw + c, acc);
}

// ---- gated group RMSNorm: one block per (row, group) ------------------------------------------------
template <class S>
__global__ void gated_fwd_k(S* y, S* rstd, const S* x, const S* z, const S* w, std::int64_t C, std::int64_t G,
                            double eps) {
  using A = typename Acc<S>::type;
  const std::int64_t mg = blockIdx.x, Cg = C / G, base = (mg / G) * C + (mg % G) * Cg, c0 = (mg % G) * Cg;
  A ss = 0;
  for (std::int64_t c = threadIdx.x; c < Cg; c += blockDim.x) {
    const A g = ld(x + base + c) * silu_<A>(ld(z + base + c));
    ss += g * g;
  }
  ss = block_sum(ss);
  const A r = A(1) / sqrt(ss / A(Cg) + A(eps));
  if (threadIdx.x == 0) st(rstd + mg, r);
  for (std::int64_t c = threadIdx.x; c < Cg; c += blockDim.x)
    st(y + base + c, ld(x + base + c) * silu_<A>(ld(z + base + c)) * r * ld(w + c0 + c));
}
template <class S>
__global__ void gated_bwd_k(S* dx, S* dz, const S* x, const S* z, const S* w, const S* rstd, const S* dy,
                            std::int64_t C, std::int64_t G) {
  using A = typename Acc<S>::type;
  const std::int64_t mg = blockIdx.x, Cg = C / G, base = (mg / G) * C + (mg % G) * Cg, c0 = (mg % G) * Cg;
  const A r = ld(rstd + mg);
  A dot = 0;
  for (std::int64_t c = threadIdx.x; c < Cg; c += blockDim.x)
    dot += ld(dy + base + c) * ld(w + c0 + c) * ld(x + base + c) * silu_<A>(ld(z + base + c));
  dot = block_sum(dot);
  const A k = r * r * r * dot / A(Cg);
  for (std::int64_t c = threadIdx.x; c < Cg; c += blockDim.x) {
    const A zv = ld(z + base + c), xv = ld(x + base + c), sz = silu_<A>(zv), gv = xv * sz;
    const A dg = r * ld(dy + base + c) * ld(w + c0 + c) - gv * k;
    st(dx + base + c, dg * sz);
    st(dz + base + c, dg * xv * dsilu_<A>(zv));
  }
}
template <class S>
__global__ void gated_bwd_dw_k(S* dw, const S* x, const S* z, const S* rstd, const S* dy, std::int64_t M,
                               std::int64_t C, std::int64_t G) {
  using A = typename Acc<S>::type;
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const std::int64_t g = c / (C / G);
  A acc = 0;
  for (std::int64_t m = 0; m < M; ++m)
    acc += ld(dy + m * C + c) * ld(x + m * C + c) * silu_<A>(ld(z + m * C + c)) * ld(rstd + m * G + g);
  st(dw + c, acc);
}

}  // namespace

void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  check_all({&y, &rstd, &x, &w}, x.dtype(), "rmsnorm_fwd");
  const std::int64_t C = w.numel(), M = x.numel() / C;
  if (M == 0) return;
  HCP_CUDA_DISPATCH(x, {
    constexpr int V = kVec<S>;
    if (C % V == 0 && aligned16(x.raw()) && aligned16(y.raw()) && aligned16(w.raw())) {
      // about kKeep vectors per thread, whole warps, at most 1024 threads
      const std::int64_t per = (C / V + kKeep - 1) / kKeep;
      const int threads = static_cast<int>(std::min<std::int64_t>(1024, std::max<std::int64_t>(32, (per + 31) / 32 * 32)));
      rmsnorm_fwd_vec_k<S><<<static_cast<unsigned>(M), threads>>>(dptr<S>(y), dptr<S>(rstd), dptr<S>(x), dptr<S>(w), C, eps);
    } else {
      rmsnorm_fwd_k<S><<<static_cast<unsigned>(M), kThreads>>>(dptr<S>(y), dptr<S>(rstd), dptr<S>(x), dptr<S>(w), C, eps);
    }
  });
  check_launch("rmsnorm_fwd");
}

void rmsnorm_bwd(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy) {
  check_all({&dx, &dw, &x, &w, &rstd, &dy}, x.dtype(), "rmsnorm_bwd");
  const std::int64_t C = w.numel(), M = x.numel() / C;
  HCP_CUDA_DISPATCH(x, {
    rmsnorm_bwd_dx_k<S><<<static_cast<unsigned>(M), kThreads>>>(dptr<S>(dx), dptr<S>(x), dptr<S>(w), dptr<S>(rstd),
                                                               dptr<S>(dy), C);
    rmsnorm_bwd_dw_k<S><<<blocks_for(C, kThreads), kThreads>>>(dptr<S>(dw), dptr<S>(x), dptr<S>(rstd), dptr<S>(dy), M, C,
                                                              1);
  });
  check_launch("rmsnorm_bwd");
}

void gated_rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w, std::int64_t G,
                       double eps) {
  check_all({&y, &rstd, &x, &z, &w}, x.dtype(), "gated_rmsnorm_fwd");
  const std::int64_t C = w.numel(), M = x.numel() / C;
  HCP_CUDA_DISPATCH(x, gated_fwd_k<S><<<static_cast<unsigned>(M * G), kThreads>>>(
                           dptr<S>(y), dptr<S>(rstd), dptr<S>(x), dptr<S>(z), dptr<S>(w), C, G, eps));
  check_launch("gated_rmsnorm_fwd");
}

void gated_rmsnorm_bwd(Tensor& dx, Tensor& dz, Tensor& dw, const Tensor& x, const Tensor& z, const Tensor& w,
                       const Tensor& rstd, std::int64_t G, const Tensor& dy) {
  check_all({&dx, &dz, &dw, &x, &z, &w, &rstd, &dy}, x.dtype(), "gated_rmsnorm_bwd");
  const std::int64_t C = w.numel(), M = x.numel() / C;
  HCP_CUDA_DISPATCH(x, {
    gated_bwd_k<S><<<static_cast<unsigned>(M * G), kThreads>>>(dptr<S>(dx), dptr<S>(dz), dptr<S>(x), dptr<S>(z),
                                                               dptr<S>(w), dptr<S>(rstd), dptr<S>(dy), C, G);
    gated_bwd_dw_k<S><<<blocks_for(C, kThreads), kThreads>>>(dptr<S>(dw), dptr<S>(x), dptr<S>(z), dptr<S>(rstd),
                                                             dptr<S>(dy), M, C, G);
  });
  check_launch("gated_rmsnorm_bwd");
}

}  // namespace hcp::kernels::cuda_impl
