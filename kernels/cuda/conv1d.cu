// CUDA causal depthwise conv1d (+ SiLU, seq_idx resets), forward and backward (host twin:
// kernels/host/conv1d.cpp). One owner per output: bitwise repeatable.
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

// ---- causal depthwise conv1d ------------------------------------------------------------------------
template <class S>
__device__ typename Acc<S>::type conv_u(const S* x, const S* w, const S* bias, const std::int64_t* seq, std::int64_t L,
                                        std::int64_t C, std::int64_t W, std::int64_t b, std::int64_t t,
                                        std::int64_t c) {
  using A = typename Acc<S>::type;
  A u = bias ? ld(bias + c) : A(0);
  const std::int64_t sq = seq ? seq[b * L + t] : 0;
  for (std::int64_t k = 0; k < W; ++k) {
    const std::int64_t src = t - (W - 1) + k;
    if (src < 0 || (seq && seq[b * L + src] != sq)) continue;
    u += ld(w + c * W + k) * ld(x + (b * L + src) * C + c);
  }
  return u;
}
template <class S>
__global__ void conv_fwd_k(S* y, const S* x, const S* w, const S* bias, const std::int64_t* seq, std::int64_t B,
                           std::int64_t L, std::int64_t C, std::int64_t W, bool silu) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= B * L * C) return;
  const std::int64_t c = i % C, t = (i / C) % L, b = i / (C * L);
  const auto u = conv_u(x, w, bias, seq, L, C, W, b, t, c);
  st(y + i, silu ? silu_(u) : u);
}
// Forward with 16-byte channel vectors: a thread owns V channels and a run of kRun time steps and
// slides a register window over the W-1 previous inputs, so each input is read once (plus a W-1 halo
// per run). Same summation order as conv_u; the SiLU uses the fast fp32 exponential and division
// (silu_fast): this bandwidth-bound kernel is short of instructions and loads in flight. Four steps
// per loop iteration, x and y not aliased (checked by conv1d_fwd), so their loads issue together.
constexpr int kRun = 32;
template <class S, int W>
__global__ void conv_fwd_vec_k(S* __restrict__ y, const S* __restrict__ x, const S* __restrict__ w,
                               const S* __restrict__ bias, const std::int64_t* __restrict__ seq, std::int64_t B,
                               std::int64_t L, std::int64_t C, bool silu) {
  using A = typename Acc<S>::type;
  constexpr int V = kVec<S>;
  const std::int64_t nv = C / V, nruns = (L + kRun - 1) / kRun;
  const std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= B * nruns * nv) return;
  const std::int64_t c0 = (idx % nv) * V, run = (idx / nv) % nruns, b = idx / (nv * nruns);
  const std::int64_t t0 = run * kRun, t1 = t0 + kRun < L ? t0 + kRun : L;
  A wk[W][V], bv[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    bv[e] = bias ? ld(bias + c0 + e) : A(0);
#pragma unroll
    for (int k = 0; k < W; ++k) wk[k][e] = ld(w + (c0 + e) * W + k);
  }
  // win[k] holds x at t - (W-1) + k for the current t; sq[k] its sequence id (an impossible id before t = 0).
  constexpr std::int64_t kNone = INT64_MIN;
  A win[W][V];
  std::int64_t sq[W];
#pragma unroll
  for (int k = 0; k < W - 1; ++k) {
    const std::int64_t src = t0 - (W - 1) + k;
    sq[k] = src < 0 ? kNone : (seq ? seq[b * L + src] : 0);
    if (src >= 0)
      ld_vec<S>(win[k], x + (b * L + src) * C + c0);
    else
#pragma unroll
      for (int e = 0; e < V; ++e) win[k][e] = 0;
  }
#pragma unroll 4
  for (std::int64_t t = t0; t < t1; ++t) {
    ld_vec<S>(win[W - 1], x + (b * L + t) * C + c0);
    sq[W - 1] = seq ? seq[b * L + t] : 0;
    A u[V];
#pragma unroll
    for (int e = 0; e < V; ++e) u[e] = bv[e];
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (sq[k] == sq[W - 1])
#pragma unroll
        for (int e = 0; e < V; ++e) u[e] += wk[k][e] * win[k][e];
#pragma unroll
    for (int e = 0; e < V; ++e) u[e] = silu ? silu_fast(u[e]) : u[e];
    st_vec<S>(y + (b * L + t) * C + c0, u);
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      sq[k] = sq[k + 1];
#pragma unroll
      for (int e = 0; e < V; ++e) win[k][e] = win[k + 1][e];
    }
  }
}
// du = dy * act'(u), kept in the accumulation type.
template <class S, class A>
__global__ void conv_du_k(A* du, const S* x, const S* w, const S* bias, const std::int64_t* seq, const S* dy,
                          std::int64_t B, std::int64_t L, std::int64_t C, std::int64_t W, bool silu) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= B * L * C) return;
  const std::int64_t c = i % C, t = (i / C) % L, b = i / (C * L);
  A d = ld(dy + i);
  if (silu) d *= dsilu_(conv_u(x, w, bias, seq, L, C, W, b, t, c));
  du[i] = d;
}
// dx[s] = sum_k w[k] du[s + W-1-k] over outputs t in the same sequence.
template <class S, class A>
__global__ void conv_dx_k(S* dx, const A* du, const S* w, const std::int64_t* seq, std::int64_t B, std::int64_t L,
                          std::int64_t C, std::int64_t W) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= B * L * C) return;
  const std::int64_t c = i % C, s = (i / C) % L, b = i / (C * L);
  const std::int64_t sq = seq ? seq[b * L + s] : 0;
  A acc = 0;
  for (std::int64_t k = 0; k < W; ++k) {
    const std::int64_t t = s + (W - 1) - k;
    if (t >= L || (seq && seq[b * L + t] != sq)) continue;
    acc += ld(w + c * W + k) * du[(b * L + t) * C + c];
  }
  st(dx + i, acc);
}
// dw[c, k] and dbias[c]. A block holds 32 channels (the lanes, so that du and x are read coalesced)
// by kSlices slices of the (b, t) rows; each thread sums its slice in row order, and the slices are
// added in a fixed order: deterministic. Widths up to kMaxConvW (the deck's limit).
constexpr int kDwLanes = 32, kMaxConvW = 16;
template <class A>
constexpr int kDwSlices = sizeof(A) == 8 ? 8 : 16;  // shared memory <= 35 KB
template <class S, class A>
__global__ void __launch_bounds__(kDwLanes* kDwSlices<A>)
    conv_dw_k(S* dw, S* db, const A* du, const S* x, const std::int64_t* seq, std::int64_t B, std::int64_t L,
              std::int64_t C, std::int64_t W) {
  constexpr int NS = kDwSlices<A>;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kDwLanes + threadIdx.x;
  A acc[kMaxConvW + 1];  // [k < W]: dw, [kMaxConvW]: bias
#pragma unroll
  for (int k = 0; k <= kMaxConvW; ++k) acc[k] = 0;
  if (c < C) {
    const std::int64_t BL = B * L, per = (BL + NS - 1) / NS, lo = threadIdx.y * per, hi = min(BL, lo + per);
    for (std::int64_t bt = lo; bt < hi; ++bt) {
      const std::int64_t b = bt / L, t = bt % L;
      const A d = du[bt * C + c];
      acc[kMaxConvW] += d;
      const std::int64_t sq = seq ? seq[bt] : 0;
#pragma unroll
      for (int k = 0; k < kMaxConvW; ++k) {
        if (k >= W) break;
        const std::int64_t src = t - (W - 1) + k;
        if (src < 0 || (seq && seq[b * L + src] != sq)) continue;
        acc[k] += ld(x + (b * L + src) * C + c) * d;
      }
    }
  }
  __shared__ A part[NS][kMaxConvW + 1][kDwLanes];
#pragma unroll
  for (int k = 0; k <= kMaxConvW; ++k) part[threadIdx.y][k][threadIdx.x] = acc[k];
  __syncthreads();
  // Thread (lane, y) finishes output k = y, y + NS, ... of its channel (k == W: the bias).
  if (c >= C) return;
  for (std::int64_t k = threadIdx.y; k <= W; k += NS) {
    const int slot = k == W ? kMaxConvW : static_cast<int>(k);
    A sum = 0;
    for (int j = 0; j < NS; ++j) sum += part[j][slot][threadIdx.x];
    if (k < W)
      st(dw + c * W + k, sum);
    else if (db)
      st(db + c, sum);
  }
}

// One new token per (b, c): conv_u's order (the oldest tap first), then the window shifts.
template <class S>
__global__ void conv_step_k(S* y, S* win, const S* x, const S* w, const S* bias, std::int64_t B, std::int64_t C,
                            std::int64_t W, bool silu) {
  using A = typename Acc<S>::type;
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= B * C) return;
  const std::int64_t b = i / C, c = i % C;
  S* col = win + b * (W - 1) * C + c;
  A u = bias ? ld(bias + c) : A(0);
  for (std::int64_t k = 0; k < W - 1; ++k) u += ld(w + c * W + k) * ld(col + k * C);
  const A xv = ld(x + i);
  u += ld(w + c * W + W - 1) * xv;
  st(y + i, silu ? silu_(u) : u);
  for (std::int64_t k = 0; k + 1 < W - 1; ++k) col[k * C] = col[(k + 1) * C];
  if (W > 1) col[(W - 2) * C] = x[i];
}
}  // namespace

void conv1d_step(Tensor& y, Tensor& window, const Tensor& x, const Tensor& w, const Tensor* bias, bool silu) {
  check_all({&y, &window, &x, &w, bias}, x.dtype(), "conv1d_step");
  const std::int64_t B = x.size(0), C = w.size(0), W = w.size(1);
  if (B * C == 0) return;
  HCP_CUDA_DISPATCH(x, {
    conv_step_k<S><<<blocks_for(B * C, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(window), dptr<S>(x), dptr<S>(w),
                                                              bias ? dptr<S>(*bias) : nullptr, B, C, W, silu);
  });
  check_launch("conv1d_step");
}

void conv1d_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu) {
  check_all({&y, &x, &w, bias}, x.dtype(), "conv1d_fwd");
  HCP_CHECK(y.raw() != x.raw(),
            "conv1d_fwd: y must not be x (the causal window reads inputs other threads' outputs would overwrite)");
  const std::int64_t B = x.size(0), L = x.size(1), C = x.size(2), W = w.size(1);
  DeviceIndex seq(seq_idx);
  HCP_CUDA_DISPATCH(x, {
    constexpr int V = kVec<S>;
    const S* bp = bias ? dptr<S>(*bias) : nullptr;
    const bool vec = C % V == 0 && aligned16(x.raw()) && aligned16(y.raw());
    const std::int64_t nthr = B * ((L + kRun - 1) / kRun) * (C / V);
    if (vec && W == 4) {
      conv_fwd_vec_k<S, 4>
          <<<blocks_for(nthr, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(x), dptr<S>(w), bp, seq.p, B, L, C, silu);
    } else if (vec && W == 2) {
      conv_fwd_vec_k<S, 2>
          <<<blocks_for(nthr, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(x), dptr<S>(w), bp, seq.p, B, L, C, silu);
    } else {
      conv_fwd_k<S><<<blocks_for(B * L * C, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(x), dptr<S>(w), bp, seq.p, B, L,
                                                                   C, W, silu);
    }
  });
  check_launch("conv1d_fwd");
}

void conv1d_bwd(Tensor& dx, Tensor& dw, Tensor* dbias, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu, const Tensor& dy) {
  check_all({&dx, &dw, dbias, &x, &w, bias, &dy}, x.dtype(), "conv1d_bwd");
  const std::int64_t B = x.size(0), L = x.size(1), C = x.size(2), W = w.size(1), n = B * L * C;
  HCP_CHECK(W >= 1 && W <= kMaxConvW, "conv1d_bwd (CUDA): width ", W, " outside 1..", kMaxConvW);
  DeviceIndex seq(seq_idx);
  HCP_CUDA_DISPATCH(x, {
    using A = typename Acc<S>::type;
    A* du = nullptr;
    HCP_CUDA_CHECK(cudaMallocAsync(&du, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(A), 0));
    const S* bp = bias ? dptr<S>(*bias) : nullptr;
    conv_du_k<S, A>
        <<<blocks_for(n, kThreads), kThreads>>>(du, dptr<S>(x), dptr<S>(w), bp, seq.p, dptr<S>(dy), B, L, C, W, silu);
    conv_dx_k<S, A><<<blocks_for(n, kThreads), kThreads>>>(dptr<S>(dx), du, dptr<S>(w), seq.p, B, L, C, W);
    conv_dw_k<S, A><<<static_cast<unsigned>((C + kDwLanes - 1) / kDwLanes), dim3(kDwLanes, kDwSlices<A>)>>>(
        dptr<S>(dw), dbias ? dptr<S>(*dbias) : nullptr, du, dptr<S>(x), seq.p, B, L, C, W);
    check_launch("conv1d_bwd");
    HCP_CUDA_CHECK(cudaFreeAsync(du, 0));
  });
}

}  // namespace hcp::kernels::cuda_impl
