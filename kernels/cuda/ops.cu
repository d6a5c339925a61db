// CUDA kernels: norms, causal conv1d, dense (cuBLAS), RoPE, embedding, cross-entropy, elementwise.
// Every reduction has a fixed order (block reductions, one owner per output), so results are
// bitwise repeatable run to run.
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

// ---- causal depthwise conv1d ------------------------------------------------------------------------
template <class S>
__device__ typename Acc<S>::type conv_u(const S* x, const S* w, const S* bias, const std::int64_t* seq, std::int64_t L,
                                        std::int64_t C, std::int64_t W, std::int64_t b, std::int64_t t, std::int64_t c) {
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
    if (src >= 0) ld_vec<S>(win[k], x + (b * L + src) * C + c0);
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
// One block per channel: dw[c, k] and dbias[c] by block reductions over (b, t).
template <class S, class A>
__global__ void conv_dw_k(S* dw, S* db, const A* du, const S* x, const std::int64_t* seq, std::int64_t B, std::int64_t L,
                          std::int64_t C, std::int64_t W) {
  const std::int64_t c = blockIdx.x;
  for (std::int64_t k = 0; k <= W; ++k) {  // k == W: the bias
    A acc = 0;
    for (std::int64_t bt = threadIdx.x; bt < B * L; bt += blockDim.x) {
      const std::int64_t b = bt / L, t = bt % L;
      const A d = du[bt * C + c];
      if (k == W) {
        acc += d;
        continue;
      }
      const std::int64_t src = t - (W - 1) + k;
      if (src < 0 || (seq && seq[b * L + src] != seq[b * L + t])) continue;
      acc += ld(x + (b * L + src) * C + c) * d;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) {
      if (k < W) st(dw + c * W + k, acc);
      else if (db) st(db + c, acc);
    }
  }
}

// ---- elementwise, bias, RoPE, embedding, cross-entropy ------------------------------------------
template <class S> __global__ void add_k(S* y, const S* a, const S* b, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) st(y + i, ld(a + i) + ld(b + i));
}
template <class S> __global__ void axpy_k(S* y, double alpha, const S* x, std::int64_t n) {
  using A = typename Acc<S>::type;
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) st(y + i, ld(y + i) + A(alpha) * ld(x + i));
}
template <class S> __global__ void bias_add_k(S* y, const S* bias, std::int64_t M, std::int64_t N) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < M * N) st(y + i, ld(y + i) + ld(bias + i % N));
}
template <class S> __global__ void col_sum_k(S* out, const S* dy, std::int64_t M, std::int64_t N) {
  using A = typename Acc<S>::type;
  const std::int64_t n = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  A acc = 0;
  for (std::int64_t m = 0; m < M; ++m) acc += ld(dy + m * N + n);
  st(out + n, acc);
}
template <class S>
__global__ void rope_k(S* y, const S* x, const std::int64_t* pos, std::int64_t T, std::int64_t H, std::int64_t D,
                       std::int64_t rd, double theta, double sign) {
  using A = typename Acc<S>::type;
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t half = rd / 2;
  if (i >= T * H * D) return;
  const std::int64_t d = i % D, w = i / D, t = w / H;
  const S* xr = x + w * D;
  if (d >= rd) {
    st(y + i, ld(xr + d));
    return;
  }
  const std::int64_t j = d < half ? d : d - half;
  const double ang = static_cast<double>(pos[t]) * pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(rd));
  const A c = A(cos(ang)), s = A(sign * sin(ang));
  const A x1 = ld(xr + j), x2 = ld(xr + j + half);
  st(y + i, d < half ? x1 * c - x2 * s : x2 * c + x1 * s);
}
// RoPE, vector path, one kernel: a block takes `tpb` consecutive tokens; it first forms their cos/sin
// rows [tpb][rd/2] in shared memory (angle in fp64 as the host computes it, from the host's own
// frequencies passed by value; reduced to [-pi, pi] before a single-precision sincos for fp32/bf16, fp64
// keeps fp64), then each thread takes work items -- a first-half vector rotated with its partner at
// +rd/2, or a pass-through vector -- with 16-byte loads and stores. No table in global memory, no
// extra launch. Needs D and rd/2 multiples of the vector width and rd/2 <= kRopeMaxHalf.
constexpr int kRopeMaxHalf = 256;
struct RopeFreq {
  double inv[kRopeMaxHalf];
};
template <class S, class I>
__global__ void rope_vec_k(S* __restrict__ y, const S* __restrict__ x, const std::int64_t* __restrict__ pos,
                           const RopeFreq freq, double sign, I T, I H, I D, I rd, I tpb) {
  using A = typename Acc<S>::type;
  constexpr int V = kVec<S>;
  extern __shared__ __align__(16) unsigned char rope_smem[];
  A* cs = reinterpret_cast<A*>(rope_smem);
  const I half = rd / 2, nrot = half / V, per_head = nrot + (D - rd) / V, per_tok = H * per_head;
  const I t0 = static_cast<I>(blockIdx.x) * tpb, nt = min(tpb, T - t0);
  A* sn = cs + tpb * half;
  for (I i = threadIdx.x; i < nt * half; i += blockDim.x) {
    const double ang = static_cast<double>(pos[t0 + i / half]) * freq.inv[i % half];
    if constexpr (std::is_same_v<A, double>) {
      cs[i] = cos(ang);
      sn[i] = sign * sin(ang);
    } else {
      constexpr double kTwoPi = 6.283185307179586476925;
      float sf, cf;
      sincosf(static_cast<float>(ang - kTwoPi * rint(ang / kTwoPi)), &sf, &cf);
      cs[i] = cf;
      sn[i] = static_cast<A>(sign) * sf;
    }
  }
  __syncthreads();
  for (I i = threadIdx.x; i < nt * per_tok; i += blockDim.x) {
    const I tl = i / per_tok, r = i % per_tok, h = r / per_head, k = r % per_head;
    const bool rot = k < nrot;
    const I o = ((t0 + tl) * H + h) * D + (rot ? k * V : rd + (k - nrot) * V);
    A v1[V];
    ld_vec<S>(v1, x + o);
    if (rot) {
      A v2[V];
      ld_vec<S>(v2, x + o + half);
      const A* c = cs + tl * half + k * V;
      const A* s_ = sn + tl * half + k * V;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A x1 = v1[e], x2 = v2[e];
        v1[e] = x1 * c[e] - x2 * s_[e];
        v2[e] = x2 * c[e] + x1 * s_[e];
      }
      st_vec<S>(y + o + half, v2);
    }
    st_vec<S>(y + o, v1);
  }
}
template <class S>
__global__ void embed_fwd_k(S* y, const S* table, const std::int64_t* ids, std::int64_t T, std::int64_t C) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < T * C) y[i] = table[ids[i / C] * C + i % C];
}
// One thread per (vocabulary row, channel): its tokens in order (CSR built on the host).
template <class S>
__global__ void embed_bwd_k(S* dtable, const S* dy, const std::int64_t* start, const std::int64_t* order, std::int64_t V,
                            std::int64_t C) {
  using A = typename Acc<S>::type;
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= V * C) return;
  const std::int64_t v = i / C, c = i % C;
  A acc = 0;
  for (std::int64_t e = start[v]; e < start[v + 1]; ++e) acc += ld(dy + order[e] * C + c);
  st(dtable + i, acc);
}
// One block per row: max, sum of exponentials, then loss or gradient.
template <class S>
__global__ void ce_k(double* loss, S* dlogits, const S* logits, const std::int64_t* labels, std::int64_t V,
                     std::int64_t ignore, double scale) {
  using A = typename Acc<S>::type;
  const std::int64_t t = blockIdx.x;
  const S* row = logits + t * V;
  const std::int64_t lab = labels[t];
  if (lab == ignore) {
    if (dlogits)
      for (std::int64_t v = threadIdx.x; v < V; v += blockDim.x) st(dlogits + t * V + v, A(0));
    if (loss && threadIdx.x == 0) loss[t] = 0;
    return;
  }
  A mx = -INFINITY;
  for (std::int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = max(mx, ld(row + v));
  __shared__ A smax[32];
  for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) smax[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = smax[0];
  for (int k = 1; k < (blockDim.x + 31) / 32; ++k) mx = max(mx, smax[k]);
  A s = 0;
  for (std::int64_t v = threadIdx.x; v < V; v += blockDim.x) s += exp(ld(row + v) - mx);
  s = block_sum(s);
  if (loss && threadIdx.x == 0) loss[t] = static_cast<double>(mx + log(s) - ld(row + lab));
  if (dlogits)
    for (std::int64_t v = threadIdx.x; v < V; v += blockDim.x)
      st(dlogits + t * V + v, A(scale) * (exp(ld(row + v) - mx) / s - (v == lab ? A(1) : A(0))));
}

cudaDataType_t cuda_type(DType d) {
  return d == DType::F64 ? CUDA_R_64F : d == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
}
cublasComputeType_t compute_type(DType d) { return d == DType::F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F; }
// C (col-major m x n, ldc) = op(A) op(B), alpha 1, beta 0.
void gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k, const void* A,
          std::int64_t lda, const void* B, std::int64_t ldb, void* C, std::int64_t ldc, DType dt) {
  const double one64 = 1, zero64 = 0;
  const float one32 = 1, zero32 = 0;
  const void* alpha = dt == DType::F64 ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  const void* beta = dt == DType::F64 ? static_cast<const void*>(&zero64) : static_cast<const void*>(&zero32);
  const cudaDataType_t t = cuda_type(dt);
  HCP_CUBLAS_CHECK(cublasGemmEx(cublas(), ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, A, t,
                                static_cast<int>(lda), B, t, static_cast<int>(ldb), beta, C, t, static_cast<int>(ldc),
                                compute_type(dt), CUBLAS_GEMM_DEFAULT));
}
void check_all(std::initializer_list<const Tensor*> ts, DType dt, const char* what) {
  for (const Tensor* t : ts)
    if (t) {
      require_cuda(*t, what);
      HCP_CHECK(t->dtype() == dt, what, ": every tensor must have the dtype of the first input (", to_string(dt), "), got ",
                to_string(t->dtype()));
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

void conv1d_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, const std::vector<std::int64_t>* seq_idx,
                bool silu) {
  check_all({&y, &x, &w, bias}, x.dtype(), "conv1d_fwd");
  HCP_CHECK(y.raw() != x.raw(), "conv1d_fwd: y must not be x (the causal window reads inputs other threads' outputs would overwrite)");
  const std::int64_t B = x.size(0), L = x.size(1), C = x.size(2), W = w.size(1);
  DeviceIndex seq(seq_idx);
  HCP_CUDA_DISPATCH(x, {
    constexpr int V = kVec<S>;
    const S* bp = bias ? dptr<S>(*bias) : nullptr;
    const bool vec = C % V == 0 && aligned16(x.raw()) && aligned16(y.raw());
    const std::int64_t nthr = B * ((L + kRun - 1) / kRun) * (C / V);
    if (vec && W == 4) {
      conv_fwd_vec_k<S, 4><<<blocks_for(nthr, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(x), dptr<S>(w), bp, seq.p, B, L,
                                                                     C, silu);
    } else if (vec && W == 2) {
      conv_fwd_vec_k<S, 2><<<blocks_for(nthr, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(x), dptr<S>(w), bp, seq.p, B, L,
                                                                     C, silu);
    } else {
      conv_fwd_k<S><<<blocks_for(B * L * C, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(x), dptr<S>(w), bp, seq.p, B, L, C,
                                                                   W, silu);
    }
  });
  check_launch("conv1d_fwd");
}

void conv1d_bwd(Tensor& dx, Tensor& dw, Tensor* dbias, const Tensor& x, const Tensor& w, const Tensor* bias,
                const std::vector<std::int64_t>* seq_idx, bool silu, const Tensor& dy) {
  check_all({&dx, &dw, dbias, &x, &w, bias, &dy}, x.dtype(), "conv1d_bwd");
  const std::int64_t B = x.size(0), L = x.size(1), C = x.size(2), W = w.size(1), n = B * L * C;
  DeviceIndex seq(seq_idx);
  HCP_CUDA_DISPATCH(x, {
    using A = typename Acc<S>::type;
    A* du = nullptr;
    HCP_CUDA_CHECK(cudaMallocAsync(&du, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(A), 0));
    const S* bp = bias ? dptr<S>(*bias) : nullptr;
    conv_du_k<S, A><<<blocks_for(n, kThreads), kThreads>>>(du, dptr<S>(x), dptr<S>(w), bp, seq.p, dptr<S>(dy), B, L, C,
                                                           W, silu);
    conv_dx_k<S, A><<<blocks_for(n, kThreads), kThreads>>>(dptr<S>(dx), du, dptr<S>(w), seq.p, B, L, C, W);
    conv_dw_k<S, A><<<static_cast<unsigned>(C), kThreads>>>(dptr<S>(dw), dbias ? dptr<S>(*dbias) : nullptr, du,
                                                             dptr<S>(x), seq.p, B, L, C, W);
    check_launch("conv1d_bwd");
    HCP_CUDA_CHECK(cudaFreeAsync(du, 0));
  });
}

void linear_fwd(Tensor& y, const Tensor& x, const Tensor& W, const Tensor* bias) {
  check_all({&y, &x, &W, bias}, x.dtype(), "linear_fwd");
  const std::int64_t N = W.size(0), K = W.size(1), M = x.numel() / K;
  if (M == 0 || N == 0) return;
  // Row-major y[M,N] = x[M,K] W^T is column-major y^T = (W^T)^T x^T.
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, W.raw(), K, x.raw(), K, y.raw(), N, x.dtype());
  if (bias) HCP_CUDA_DISPATCH(x, bias_add_k<S><<<blocks_for(M * N, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(*bias), M, N));
  check_launch("linear_fwd");
}

void linear_bwd(Tensor* dx, Tensor* dW, Tensor* dbias, const Tensor& x, const Tensor& W, const Tensor& dy) {
  check_all({dx, dW, dbias, &x, &W, &dy}, x.dtype(), "linear_bwd");
  const std::int64_t N = W.size(0), K = W.size(1), M = x.numel() / K;
  if (dx) {
    if (M * K == 0) {
    } else if (N == 0) {
      HCP_CUDA_CHECK(cudaMemset(dx->raw(), 0, dx->nbytes()));
    } else {
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, W.raw(), K, dy.raw(), N, dx->raw(), K, x.dtype());  // dx = dy W
    }
  }
  if (dW) {
    if (M == 0) HCP_CUDA_CHECK(cudaMemset(dW->raw(), 0, dW->nbytes()));
    else gemm(CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x.raw(), K, dy.raw(), N, dW->raw(), K, x.dtype());  // dW = dy^T x
  }
  if (dbias) HCP_CUDA_DISPATCH(x, col_sum_k<S><<<blocks_for(N, kThreads), kThreads>>>(dptr<S>(*dbias), dptr<S>(dy), M, N));
  check_launch("linear_bwd");
}

void rope_apply(Tensor& y, const Tensor& x, const std::vector<std::int64_t>& positions, double theta, std::int64_t rd,
                double sign) {
  check_all({&y, &x}, x.dtype(), "rope");
  const std::int64_t T = x.size(0), H = x.size(1), D = x.size(2);
  if (x.numel() == 0) return;
  DeviceIndex pos(&positions);
  HCP_CUDA_DISPATCH(x, {
    using A = typename Acc<S>::type;
    constexpr int V = kVec<S>;
    const std::int64_t half = rd / 2;
    if (D % V == 0 && half % V == 0 && half <= kRopeMaxHalf && aligned16(x.raw()) && aligned16(y.raw())) {
      RopeFreq freq{};  // the host kernel's frequencies, bit for bit (the unused tail zero)
      for (std::int64_t j = 0; j < half; ++j)
        freq.inv[j] = std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(rd));
      // Tokens per block: enough to give 256 threads about one work item each.
      const std::int64_t per_tok = H * (half + D - rd) / V, tpb = std::max<std::int64_t>(1, kThreads / per_tok);
      const auto blocks = static_cast<unsigned>((T + tpb - 1) / tpb);
      const std::size_t smem = static_cast<std::size_t>(2 * tpb * half) * sizeof(A);
      if (T * H * D < (std::int64_t{1} << 31))
        rope_vec_k<S, int><<<blocks, kThreads, smem>>>(dptr<S>(y), dptr<S>(x), pos.p, freq, sign, static_cast<int>(T),
                                                       static_cast<int>(H), static_cast<int>(D), static_cast<int>(rd),
                                                       static_cast<int>(tpb));
      else
        rope_vec_k<S, std::int64_t><<<blocks, kThreads, smem>>>(dptr<S>(y), dptr<S>(x), pos.p, freq, sign, T, H, D, rd, tpb);
    } else {
      rope_k<S><<<blocks_for(T * H * D, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(x), pos.p, T, H, D, rd, theta, sign);
    }
  });
  check_launch("rope");
}

void embedding_fwd(Tensor& y, const Tensor& table, const std::vector<std::int64_t>& ids) {
  check_all({&y, &table}, table.dtype(), "embedding_fwd");
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), C = table.size(1);
  if (T == 0) return;
  DeviceIndex id(&ids);
  HCP_CUDA_DISPATCH(table, embed_fwd_k<S><<<blocks_for(T * C, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(table), id.p, T, C));
  check_launch("embedding_fwd");
}

void embedding_bwd(Tensor& dtable, const std::vector<std::int64_t>& ids, const Tensor& dy) {
  check_all({&dtable, &dy}, dy.dtype(), "embedding_bwd");
  const std::int64_t V = dtable.size(0), C = dtable.size(1), T = static_cast<std::int64_t>(ids.size());
  std::vector<std::int64_t> start(static_cast<std::size_t>(V + 1), 0), order(static_cast<std::size_t>(std::max<std::int64_t>(T, 1)));
  for (auto v : ids) start[static_cast<std::size_t>(v + 1)]++;
  for (std::int64_t v = 0; v < V; ++v) start[static_cast<std::size_t>(v + 1)] += start[static_cast<std::size_t>(v)];
  std::vector<std::int64_t> fill(start.begin(), start.end() - 1);
  for (std::int64_t t = 0; t < T; ++t) order[static_cast<std::size_t>(fill[static_cast<std::size_t>(ids[static_cast<std::size_t>(t)])]++)] = t;
  DeviceIndex st_(&start), ord(&order);
  HCP_CUDA_DISPATCH(dy, embed_bwd_k<S><<<blocks_for(V * C, kThreads), kThreads>>>(dptr<S>(dtable), dptr<S>(dy), st_.p,
                                                                                   ord.p, V, C));
  check_launch("embedding_bwd");
}

double cross_entropy_fwd(const Tensor& logits, const std::vector<std::int64_t>& labels, std::int64_t ignore,
                         std::int64_t* count) {
  check_all({&logits}, logits.dtype(), "cross_entropy_fwd");
  const std::int64_t T = logits.size(0), V = logits.size(1);
  if (count) *count = 0;
  if (T == 0) return 0.0;
  DeviceIndex lab(&labels);
  const DeviceArray<double> lbuf(nullptr, static_cast<std::size_t>(T));
  double* loss = lbuf.p;
  HCP_CUDA_DISPATCH(logits, ce_k<S><<<static_cast<unsigned>(T), kThreads>>>(loss, static_cast<S*>(nullptr),
                                                                           dptr<S>(logits), lab.p, V, ignore, 0.0));
  check_launch("cross_entropy_fwd");
  std::vector<double> h(static_cast<std::size_t>(T));
  HCP_CUDA_CHECK(cudaMemcpy(h.data(), loss, h.size() * sizeof(double), cudaMemcpyDeviceToHost));
  double sum = 0;  // in token order, as the host does
  std::int64_t n = 0;
  for (std::int64_t t = 0; t < T; ++t)
    if (labels[static_cast<std::size_t>(t)] != ignore) {
      sum += h[static_cast<std::size_t>(t)];
      ++n;
    }
  if (count) *count = n;
  return sum;
}

void cross_entropy_bwd(Tensor& dlogits, const Tensor& logits, const std::vector<std::int64_t>& labels, std::int64_t ignore,
                       double scale) {
  check_all({&dlogits, &logits}, logits.dtype(), "cross_entropy_bwd");
  const std::int64_t T = logits.size(0), V = logits.size(1);
  if (T == 0) return;
  DeviceIndex lab(&labels);
  HCP_CUDA_DISPATCH(logits, ce_k<S><<<static_cast<unsigned>(T), kThreads>>>(nullptr, dptr<S>(dlogits), dptr<S>(logits),
                                                                           lab.p, V, ignore, scale));
  check_launch("cross_entropy_bwd");
}

void add(Tensor& y, const Tensor& a, const Tensor& b) {
  check_all({&y, &a, &b}, a.dtype(), "add");
  const std::int64_t n = a.numel();
  if (n) HCP_CUDA_DISPATCH(a, add_k<S><<<blocks_for(n, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(a), dptr<S>(b), n));
  check_launch("add");
}

void axpy(Tensor& y, double alpha, const Tensor& x) {
  check_all({&y, &x}, x.dtype(), "axpy");
  const std::int64_t n = x.numel();
  if (n) HCP_CUDA_DISPATCH(x, axpy_k<S><<<blocks_for(n, kThreads), kThreads>>>(dptr<S>(y), alpha, dptr<S>(x), n));
  check_launch("axpy");
}

namespace {
// Fixed grid and fixed per-thread strides: the partial sums, and so the result, never change.
constexpr int kSqBlocks = 256;
template <class S> __global__ void sumsq_k(double* part, const S* x, std::int64_t n) {
  double acc = 0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const double v = static_cast<double>(ld(x + i));
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
template <class S> __global__ void adamw_k(S* p, const S* g, S* m, S* v, std::int64_t n, AdamWStep s) {
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
    adamw_k<double><<<blocks_for(n, kThreads), kThreads>>>(dptr<double>(p), dptr<double>(g), dptr<double>(m), dptr<double>(v), n, s);
  else
    adamw_k<float><<<blocks_for(n, kThreads), kThreads>>>(dptr<float>(p), dptr<float>(g), dptr<float>(m), dptr<float>(v), n, s);
  check_launch("adamw_update");
}

}  // namespace hcp::kernels::cuda_impl
