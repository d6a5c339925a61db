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
  auto out = [&](std::int64_t i, A(&v)[V]) {
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
// ---- weight gradients: column sums over the rows, in two deterministic stages ---------------------
// Stage 1: a block takes 32 channels (the lanes: coalesced reads) and one slice of rows; its 8 warps
// take every 8th row of the slice, and their sums are added in warp order into part[slice, c].
// Stage 2: the slices in order. (One thread per channel over every row kept only C/256 blocks busy:
// 11-16 of the H200's 132 SMs at C = 2688-4096.)
constexpr int kColWarps = 8;
template <class S>
struct RmsDwTerm {  // dy * x * rstd (the weight gradient of RMSNorm)
  const S *x, *rstd, *dy;
  std::int64_t C, G;
  __device__ typename Acc<S>::type operator()(std::int64_t m, std::int64_t c) const {
    return ld(dy + m * C + c) * ld(x + m * C + c) * ld(rstd + m * G + c / (C / G));
  }
};
template <class S>
struct GatedDwTerm {  // dy * x * silu(z) * rstd (gated group RMSNorm)
  const S *x, *z, *rstd, *dy;
  std::int64_t C, G;
  __device__ typename Acc<S>::type operator()(std::int64_t m, std::int64_t c) const {
    using A = typename Acc<S>::type;
    return ld(dy + m * C + c) * ld(x + m * C + c) * silu_<A>(ld(z + m * C + c)) * ld(rstd + m * G + c / (C / G));
  }
};
template <class A, class Term>
__global__ void colsum_part_k(A* part, Term term, std::int64_t M, std::int64_t C, std::int64_t rows_per_slice) {
  __shared__ A sh[kColWarps][32];
  const int lane = static_cast<int>(threadIdx.x % 32), w = static_cast<int>(threadIdx.x / 32);
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + lane, slice = blockIdx.y;
  const std::int64_t r0 = slice * rows_per_slice, r1 = r0 + rows_per_slice < M ? r0 + rows_per_slice : M;
  A acc = 0;
  if (c < C)
    for (std::int64_t m = r0 + w; m < r1; m += kColWarps) acc += term(m, c);
  sh[w][lane] = acc;
  __syncthreads();
  if (w == 0 && c < C) {
    A sum = 0;
    for (int k = 0; k < kColWarps; ++k) sum += sh[k][lane];
    part[slice * C + c] = sum;
  }
}
template <class S, class A>
__global__ void colsum_final_k(S* out, const A* part, std::int64_t slices, std::int64_t C) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  A sum = 0;
  for (std::int64_t k = 0; k < slices; ++k) sum += part[k * C + c];
  st(out + c, sum);
}
// out[c] = sum over m of term(m, c), M rows and C channels (stream 0, scratch from its pool).
template <class S, class Term>
void column_sums(S* out, Term term, std::int64_t M, std::int64_t C) {
  using A = typename Acc<S>::type;
  if (C == 0) return;
  const std::int64_t slices = std::max<std::int64_t>(1, std::min<std::int64_t>(256, (M + 63) / 64));
  const std::int64_t rows = std::max<std::int64_t>(1, (M + slices - 1) / slices);
  A* part = nullptr;
  HCP_CUDA_CHECK(cudaMallocAsync(&part, static_cast<std::size_t>(slices * C) * sizeof(A), 0));
  colsum_part_k<A, Term><<<dim3(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(slices)), 32 * kColWarps>>>(
      part, term, M, C, rows);
  colsum_final_k<S, A><<<blocks_for(C, kThreads), kThreads>>>(out, part, slices, C);
  HCP_CUDA_CHECK(cudaFreeAsync(part, 0));
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
      const int threads =
          static_cast<int>(std::min<std::int64_t>(1024, std::max<std::int64_t>(32, (per + 31) / 32 * 32)));
      rmsnorm_fwd_vec_k<S>
          <<<static_cast<unsigned>(M), threads>>>(dptr<S>(y), dptr<S>(rstd), dptr<S>(x), dptr<S>(w), C, eps);
    } else {
      rmsnorm_fwd_k<S>
          <<<static_cast<unsigned>(M), kThreads>>>(dptr<S>(y), dptr<S>(rstd), dptr<S>(x), dptr<S>(w), C, eps);
    }
  });
  check_launch("rmsnorm_fwd");
}

void rmsnorm_bwd(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy) {
  check_all({&dx, &dw, &x, &w, &rstd, &dy}, x.dtype(), "rmsnorm_bwd");
  const std::int64_t C = w.numel(), M = x.numel() / C;
  HCP_CUDA_DISPATCH(x, {
    rmsnorm_bwd_dx_k<S>
        <<<static_cast<unsigned>(M), kThreads>>>(dptr<S>(dx), dptr<S>(x), dptr<S>(w), dptr<S>(rstd), dptr<S>(dy), C);
    column_sums<S>(dptr<S>(dw), RmsDwTerm<S>{dptr<S>(x), dptr<S>(rstd), dptr<S>(dy), C, 1}, M, C);
  });
  check_launch("rmsnorm_bwd");
}

void gated_rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& z, const Tensor& w, std::int64_t G,
                       double eps) {
  check_all({&y, &rstd, &x, &z, &w}, x.dtype(), "gated_rmsnorm_fwd");
  const std::int64_t C = w.numel(), M = x.numel() / C;
  HCP_CUDA_DISPATCH(x, gated_fwd_k<S><<<static_cast<unsigned>(M * G), kThreads>>>(dptr<S>(y), dptr<S>(rstd), dptr<S>(x),
                                                                                  dptr<S>(z), dptr<S>(w), C, G, eps));
  check_launch("gated_rmsnorm_fwd");
}

void gated_rmsnorm_bwd(Tensor& dx, Tensor& dz, Tensor& dw, const Tensor& x, const Tensor& z, const Tensor& w,
                       const Tensor& rstd, std::int64_t G, const Tensor& dy) {
  check_all({&dx, &dz, &dw, &x, &z, &w, &rstd, &dy}, x.dtype(), "gated_rmsnorm_bwd");
  const std::int64_t C = w.numel(), M = x.numel() / C;
  HCP_CUDA_DISPATCH(x, {
    gated_bwd_k<S><<<static_cast<unsigned>(M * G), kThreads>>>(dptr<S>(dx), dptr<S>(dz), dptr<S>(x), dptr<S>(z),
                                                               dptr<S>(w), dptr<S>(rstd), dptr<S>(dy), C, G);
    column_sums<S>(dptr<S>(dw), GatedDwTerm<S>{dptr<S>(x), dptr<S>(z), dptr<S>(rstd), dptr<S>(dy), C, G}, M, C);
  });
  check_launch("gated_rmsnorm_bwd");
}

}  // namespace hcp::kernels::cuda_impl
