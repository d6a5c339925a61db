// MoE routing on the GPU: the router (sigmoid/softmax scores, selection by score + correction bias,
// group-limited top-k, renormalisation, scaling) with one warp per token (one thread per token with
// a group limit) and its backward; the routing's index tensors made on the device (a histogram of
// the choices, whose E counts are the one copy to the host, and a stable counting sort, one block
// per expert); permute / combine and their backward as gathers with one owner per output, 16 bytes
// per thread where rows allow.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels::cuda_impl {
using namespace hcp::cuda;

namespace {
constexpr int kThreads = 256;
constexpr int kMaxE = 512;

template <class A>
__device__ __forceinline__ bool before(A a, std::int64_t ia, A b, std::int64_t ib) {
  return a > b || (a == b && ia < ib);
}

// One thread per token: scores, the group limit (the topk_group groups with the largest sum of their
// two best selection scores), the top-k by selection score and their weights.
template <class S, class A>
__global__ void router_fwd_k(S* scores, double* idx, S* w, const S* logits, const S* bias, std::int64_t Tn,
                             std::int64_t E, std::int64_t K, bool sig, std::int64_t n_group, std::int64_t topk_group,
                             bool renorm, double scaling) {
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= Tn) return;
  const S* lr = logits + t * E;
  S* sr = scores + t * E;
  A mx = -INFINITY, sum = 0;
  if (!sig) {
    for (std::int64_t e = 0; e < E; ++e) mx = max(mx, A(ld(lr + e)));
    for (std::int64_t e = 0; e < E; ++e) sum += exp(ld(lr + e) - mx);
  }
  for (std::int64_t e = 0; e < E; ++e) st(sr + e, sig ? sigmoid_(A(ld(lr + e))) : exp(ld(lr + e) - mx) / sum);
  // Selection and weights from the unrounded scores (as the host does before storing them).
  auto score = [&](std::int64_t e) { return sig ? sigmoid_(A(ld(lr + e))) : A(exp(ld(lr + e) - mx) / sum); };
  auto sel = [&](std::int64_t e) { return score(e) + (bias ? A(ld(bias + e)) : A(0)); };
  // Group-limited selection: the topk_group groups with the largest sum of their top-2 scores.
  unsigned char allowed[kMaxE];
  for (std::int64_t e = 0; e < E; ++e) allowed[e] = 1;
  const std::int64_t gs = E / n_group;
  if (n_group > 1) {
    A gsc[64];
    for (std::int64_t g = 0; g < n_group; ++g) {
      A b1 = -INFINITY, b2 = -INFINITY;
      for (std::int64_t e = g * gs; e < (g + 1) * gs; ++e) {
        const A v = sel(e);
        if (v > b1)
          b2 = b1, b1 = v;
        else if (v > b2)
          b2 = v;
      }
      gsc[g] = b1 + (gs > 1 ? b2 : A(0));
    }
    unsigned char taken[64] = {0};
    for (std::int64_t e = 0; e < E; ++e) allowed[e] = 0;
    for (std::int64_t r = 0; r < topk_group; ++r) {
      std::int64_t best = -1;
      for (std::int64_t g = 0; g < n_group; ++g)
        if (!taken[g] && (best < 0 || before(gsc[g], g, gsc[best], best))) best = g;
      taken[best] = 1;
      for (std::int64_t e = best * gs; e < (best + 1) * gs; ++e) allowed[e] = 1;
    }
  }
  A tot = 0;
  for (std::int64_t k = 0; k < K; ++k) {
    std::int64_t best = -1;
    for (std::int64_t e = 0; e < E; ++e)
      if (allowed[e] && (best < 0 || before(sel(e), e, sel(best), best))) best = e;
    allowed[best] = 0;
    idx[t * K + k] = static_cast<double>(best);
    tot += score(best);
  }
  for (std::int64_t k = 0; k < K; ++k) {
    A v = score(static_cast<std::int64_t>(idx[t * K + k]));
    if (renorm) v /= (tot + A(1e-20));
    st(w + t * K + k, v * A(scaling));
  }
}

// The same without a group limit, one warp per token: lane l holds experts l, l + 32, ... (J of
// them); the top-k are K rounds of a warp arg-max with the same tie rule (the lower expert index).
template <class S, class A, int J>
__global__ void router_fwd_warp_k(S* scores, double* idx, S* w, const S* logits, const S* bias, std::int64_t Tn, int E,
                                  int K, bool sig, bool renorm, double scaling) {
  const std::int64_t t = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (t >= Tn) return;
  const S* lr = logits + t * E;
  A lg[J], sc[J], se[J];
  A mx = -INFINITY, sum = 0;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int e = lane + 32 * j;
    lg[j] = e < E ? A(ld(lr + e)) : A(-INFINITY);
    mx = max(mx, lg[j]);
  }
  if (!sig) {
    mx = warp_max(mx);
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (lane + 32 * j < E) sum += exp(lg[j] - mx);
    sum = warp_sum(sum);
  }
  unsigned open = 0;  // bit j: expert lane + 32 j exists and is not chosen yet
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int e = lane + 32 * j;
    if (e >= E) continue;
    sc[j] = sig ? sigmoid_(lg[j]) : A(exp(lg[j] - mx) / sum);
    st(scores + t * E + e, sc[j]);
    se[j] = sc[j] + (bias ? A(ld(bias + e)) : A(0));
    open |= 1u << j;
  }
  A tot = 0, my_score = 0;
  int my_idx = 0;
  for (int k = 0; k < K; ++k) {
    A bv = 0;
    int be = -1;
#pragma unroll
    for (int j = 0; j < J; ++j)  // ascending experts: a strict > keeps the lower index on ties
      if ((open >> j & 1u) && (be < 0 || se[j] > bv)) bv = se[j], be = lane + 32 * j;
    for (int o = 16; o > 0; o >>= 1) {
      const A ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe;
    }
    A mine = 0;
#pragma unroll
    for (int j = 0; j < J; ++j)
      if (lane + 32 * j == be) {
        mine = sc[j];
        open &= ~(1u << j);
      }
    const A bs = __shfl_sync(0xffffffffu, mine, be & 31);
    tot += bs;
    if (lane == k) my_score = bs, my_idx = be;
  }
  if (lane < K) {
    A v = my_score;
    if (renorm) v /= (tot + A(1e-20));
    idx[t * K + lane] = static_cast<double>(my_idx);
    st(w + t * K + lane, v * A(scaling));
  }
}

template <class S, class A>
__global__ void router_bwd_k(S* dlogits, const S* scores, const double* idx, const S* dw, const S* dscores,
                             std::int64_t Tn, std::int64_t E, std::int64_t K, bool sig, bool renorm, double scaling) {
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= Tn) return;
  const S* sr = scores + t * E;
  S* dl = dlogits + t * E;
  const A sc = A(scaling);
  A sum = 0, dot = 0;
  const auto at = [&](std::int64_t k) { return static_cast<std::int64_t>(idx[t * K + k]); };
  for (std::int64_t k = 0; k < K; ++k) {
    sum += ld(sr + at(k));
    dot += ld(dw + t * K + k) * ld(sr + at(k));
  }
  sum += A(1e-20);
  // ds[e]: from the optional dscores plus the selected experts' weights.
  auto ds = [&](std::int64_t e) {
    A v = dscores ? A(ld(dscores + t * E + e)) : A(0);
    for (std::int64_t k = 0; k < K; ++k)
      if (at(k) == e) v += renorm ? sc * (A(ld(dw + t * K + k)) / sum - dot / (sum * sum)) : sc * A(ld(dw + t * K + k));
    return v;
  };
  if (sig) {
    for (std::int64_t e = 0; e < E; ++e) {
      const A s = ld(sr + e);
      st(dl + e, ds(e) * s * (A(1) - s));
    }
  } else {
    A inner = 0;
    for (std::int64_t e = 0; e < E; ++e) inner += ds(e) * A(ld(sr + e));
    for (std::int64_t e = 0; e < E; ++e) st(dl + e, A(ld(sr + e)) * (ds(e) - inner));
  }
}

// out row r = in row map[r] / div (a gather), C channels.
template <class S, int W>
__global__ void gather_rows_k(S* out, const S* in, const double* map, std::int64_t rows, std::int64_t C,
                              std::int64_t div) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x, nv = C / W;
  if (i >= rows * nv) return;
  const std::int64_t r = i / nv, c = (i % nv) * W;
  const S* src = in + (static_cast<std::int64_t>(map[r]) / div) * C + c;
  S* dst = out + r * C + c;
  if constexpr (W == kVec<S>)
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  else
#pragma unroll
    for (int k = 0; k < W; ++k) dst[k] = src[k];
}
// y[t] = sum_k w[t,k] * yp[inv[t*K+k]] (w = nullptr: weight 1).
template <class S, class A, int W>
__global__ void combine_k(S* y, const S* yp, const double* inv, const S* w, std::int64_t Tn, std::int64_t K,
                          std::int64_t C) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x, nv = C / W;
  if (i >= Tn * nv) return;
  const std::int64_t t = i / nv, c = (i % nv) * W;
  A acc[W] = {}, v[W];
  for (std::int64_t k = 0; k < K; ++k) {
    const A wk = w ? A(ld(w + t * K + k)) : A(1);
    ldw<W>(v, yp + static_cast<std::int64_t>(inv[t * K + k]) * C + c);
#pragma unroll
    for (int e = 0; e < W; ++e) acc[e] += wk * v[e];
  }
  stw<W>(y + t * C + c, acc);
}
// One warp per permuted row r: dyp[r] = w[a] dy[t], dw[a] = dy[t] . yp[r].
template <class S, class A, int W>
__global__ void combine_bwd_k(S* dyp, S* dw, const S* dy, const S* yp, const double* src, const S* w, std::int64_t TK,
                              std::int64_t K, std::int64_t C) {
  const std::int64_t r = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= TK) return;
  const std::int64_t a = static_cast<std::int64_t>(src[r]), t = a / K;
  const A wa = ld(w + a);
  A dot = 0, g[W], o[W];
  for (std::int64_t c = lane * W; c < C; c += 32 * W) {
    ldw<W>(g, dy + t * C + c);
    ldw<W>(o, yp + r * C + c);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      dot += g[e] * o[e];
      g[e] *= wa;
    }
    stw<W>(dyp + r * C + c, g);
  }
  for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  if (lane == 0) st(dw + a, dot);
}
// counts[e] += the assignments to expert e (integer atomics: exact, in any order).
__global__ void count_k(unsigned long long* counts, const double* idx, std::int64_t n, int E) {
  extern __shared__ unsigned hist[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    atomicAdd(&hist[static_cast<int>(idx[i])], 1u);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    if (hist[e]) atomicAdd(&counts[e], static_cast<unsigned long long>(hist[e]));
}
// The stable expert sort: block e lists expert e's assignments in ascending order from row off[e]
// (src[row] = a, inv[a] = row), by a block-wide count of "idx[a] == e" over chunks of blockDim.x.
__global__ void route_sort_k(double* src, double* inv, const double* idx, const std::int64_t* off, std::int64_t n) {
  __shared__ int warp_hits[32];
  const int e = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  std::int64_t row = off[e];
  for (std::int64_t a0 = 0; a0 < n; a0 += blockDim.x) {  // uniform over the block
    const std::int64_t a = a0 + threadIdx.x;
    const bool hit = a < n && static_cast<int>(idx[a]) == e;
    const unsigned m = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_hits[w] = __popc(m);
    __syncthreads();
    int before = 0, total = 0;
    for (int i = 0; i < nw; ++i) {
      before += i < w ? warp_hits[i] : 0;
      total += warp_hits[i];
    }
    if (hit) {
      const std::int64_t r = row + before + __popc(m & ((1u << lane) - 1u));
      src[r] = static_cast<double>(a);
      inv[a] = static_cast<double>(r);
    }
    row += total;
    __syncthreads();
  }
}

const double* ids(const Tensor& t) { return static_cast<const double*>(t.raw()); }  // an index tensor's integers
}  // namespace

void router_fwd(Tensor& scores, MoeRouting& route, Tensor& topk_w, const Tensor& logits, const Tensor* bias,
                const RouterParams& p) {
  check_same({&logits, &scores, &topk_w, bias}, "router_fwd");
  HCP_CHECK(p.experts <= kMaxE && p.n_group <= 64, "router (CUDA): at most ", kMaxE, " experts and 64 groups");
  const std::int64_t Tn = logits.size(0), E = p.experts, K = p.topk;
  route.idx = Tensor::empty({Tn * K}, DType::F64, Space::Cuda);
  route.counts.assign(static_cast<std::size_t>(E), 0);
  if (Tn == 0) return;
  double* idx = static_cast<double*>(route.idx.raw());
  HCP_CUDA_DISPATCH(logits, {
    using A = typename Acc<S>::type;
    const S* b = bias ? dptr<S>(*bias) : nullptr;
    const auto warp = [&](auto j) {
      router_fwd_warp_k<S, A, decltype(j)::value><<<blocks_for(Tn * 32, 256), 256>>>(
          dptr<S>(scores), idx, dptr<S>(topk_w), dptr<S>(logits), b, Tn, static_cast<int>(E), static_cast<int>(K),
          p.sigmoid, p.renormalize, p.scaling);
    };
    if (p.n_group > 1 || K > 32)
      router_fwd_k<S, A><<<blocks_for(Tn, 128), 128>>>(dptr<S>(scores), idx, dptr<S>(topk_w), dptr<S>(logits), b, Tn, E,
                                                       K, p.sigmoid, p.n_group, p.topk_group, p.renormalize, p.scaling);
    else if (E <= 128)
      warp(std::integral_constant<int, 4>{});
    else if (E <= 256)
      warp(std::integral_constant<int, 8>{});
    else
      warp(std::integral_constant<int, 16>{});
  });
  check_launch("router_fwd");
  // The counts per expert, the one copy to the host: they size the grouped GEMMs and the EP exchange.
  const DeviceArray<unsigned long long> cnt(nullptr, static_cast<std::size_t>(E));
  HCP_CUDA_CHECK(cudaMemsetAsync(cnt.p, 0, static_cast<std::size_t>(E) * sizeof(unsigned long long), 0));
  const std::int64_t n = Tn * K;
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(blocks_for(n, 256), 264));
  count_k<<<grid, 256, static_cast<std::size_t>(E) * sizeof(unsigned)>>>(cnt.p, idx, n, static_cast<int>(E));
  check_launch("router_fwd (counts)");
  std::vector<unsigned long long> h(static_cast<std::size_t>(E));
  HCP_CUDA_CHECK(cudaMemcpy(h.data(), cnt.p, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  route.counts.assign(h.begin(), h.end());
}

void router_bwd(Tensor& dlogits, const Tensor& scores, const MoeRouting& route, const Tensor& dtopk_w,
                const Tensor* dscores, const RouterParams& p) {
  check_same({&scores, &dlogits, &dtopk_w, dscores}, "router_bwd");
  require_cuda(route.idx, "router_bwd: the routing");
  const std::int64_t E = p.experts, K = p.topk, Tn = scores.numel() / E;
  if (Tn == 0) return;
  HCP_CUDA_DISPATCH(scores, {
    using A = typename Acc<S>::type;
    router_bwd_k<S, A><<<blocks_for(Tn, 128), 128>>>(dptr<S>(dlogits), dptr<S>(scores), ids(route.idx),
                                                     dptr<S>(dtopk_w), dscores ? dptr<S>(*dscores) : nullptr, Tn, E, K,
                                                     p.sigmoid, p.renormalize, p.scaling);
  });
  check_launch("router_bwd");
}

void moe_permute(Tensor& xp, MoeRouting& route, const Tensor& x) {
  check_same({&x, &xp}, "moe_permute");
  require_cuda(route.idx, "moe_permute: the routing");
  const std::int64_t TK = route.idx.numel(), C = x.size(1), E = static_cast<std::int64_t>(route.counts.size());
  route.src = Tensor::empty({TK}, DType::F64, Space::Cuda);
  route.inv = Tensor::empty({TK}, DType::F64, Space::Cuda);
  if (TK == 0) return;
  const std::vector<std::int64_t> off = route.offsets();
  const DeviceIndex doff(&off);
  route_sort_k<<<static_cast<unsigned>(E), 1024>>>(static_cast<double*>(route.src.raw()),
                                                   static_cast<double*>(route.inv.raw()), ids(route.idx), doff.p, TK);
  check_launch("moe_permute (sort)");
  HCP_CUDA_DISPATCH(x, with_width<S>({C}, {xp.raw(), x.raw()}, [&](auto w) {
                      constexpr int W = decltype(w)::value;
                      gather_rows_k<S, W><<<blocks_for(TK * C / W, kThreads), kThreads>>>(
                          dptr<S>(xp), dptr<S>(x), ids(route.src), TK, C, route.topk);
                    }));
  check_launch("moe_permute");
}

void moe_permute_bwd(Tensor& dx, const Tensor& dxp, const MoeRouting& route) {
  check_same({&dxp, &dx}, "moe_permute_bwd");
  require_cuda(route.inv, "moe_permute_bwd: the routing");
  const std::int64_t TK = route.inv.numel(), topk = route.topk, Tn = TK / topk,
                     C = dxp.numel() / std::max<std::int64_t>(TK, 1);
  if (TK == 0) return;
  HCP_CUDA_DISPATCH(dxp, {
    using A = typename Acc<S>::type;
    with_width<S>({C}, {dx.raw(), dxp.raw()}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      combine_k<S, A, W><<<blocks_for(Tn * C / W, kThreads), kThreads>>>(dptr<S>(dx), dptr<S>(dxp), ids(route.inv),
                                                                         nullptr, Tn, topk, C);
    });
  });
  check_launch("moe_permute_bwd");
}

void moe_combine_fwd(Tensor& y, const Tensor& yp, const MoeRouting& route, const Tensor& topk_w) {
  check_same({&yp, &y, &topk_w}, "moe_combine_fwd");
  require_cuda(route.inv, "moe_combine_fwd: the routing");
  const std::int64_t TK = route.inv.numel(), C = yp.numel() / TK, K = topk_w.dim() == 2 ? topk_w.size(1) : 1,
                     Tn = TK / K;
  HCP_CUDA_DISPATCH(yp, {
    using A = typename Acc<S>::type;
    with_width<S>({C}, {y.raw(), yp.raw()}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      combine_k<S, A, W><<<blocks_for(Tn * C / W, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(yp), ids(route.inv),
                                                                         dptr<S>(topk_w), Tn, K, C);
    });
  });
  check_launch("moe_combine_fwd");
}

void moe_combine_bwd(Tensor& dyp, Tensor& dtopk_w, const Tensor& dy, const Tensor& yp, const MoeRouting& route,
                     const Tensor& topk_w) {
  check_same({&yp, &dyp, &dtopk_w, &dy, &topk_w}, "moe_combine_bwd");
  require_cuda(route.src, "moe_combine_bwd: the routing");
  const std::int64_t TK = route.src.numel(), C = yp.numel() / TK, K = topk_w.dim() == 2 ? topk_w.size(1) : 1;
  HCP_CUDA_DISPATCH(yp, {
    using A = typename Acc<S>::type;
    with_width<S>({C}, {dyp.raw(), dy.raw(), yp.raw()}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      combine_bwd_k<S, A, W><<<blocks_for(TK * 32, kThreads), kThreads>>>(
          dptr<S>(dyp), dptr<S>(dtopk_w), dptr<S>(dy), dptr<S>(yp), ids(route.src), dptr<S>(topk_w), TK, K, C);
    });
  });
  check_launch("moe_combine_bwd");
}

}  // namespace hcp::kernels::cuda_impl
