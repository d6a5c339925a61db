// MoE on the GPU: router (sigmoid/softmax scores, selection by score + correction bias, group-limited
// top-k, renormalisation, scaling) with one thread per token, its backward; permute / combine and
// their backward as gathers with one owner per output (the row maps are built on the host, as the
// token->expert assignment is a host vector in the kernel API); expert MLPs as grouped GEMMs
// (grouped_gemm.cu: one launch over all experts per GEMM) with squared ReLU or SwiGLU between them.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels::cuda_impl {
using namespace hcp::cuda;

namespace {
constexpr int kThreads = 256;
constexpr int kMaxE = 512;

template <class A> __device__ __forceinline__ bool before(A a, std::int64_t ia, A b, std::int64_t ib) {
  return a > b || (a == b && ia < ib);
}

template <class S, class A>
__global__ void router_fwd_k(S* scores, std::int64_t* idx, S* w, const S* logits, const S* bias, std::int64_t Tn,
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
        if (v > b1) b2 = b1, b1 = v;
        else if (v > b2) b2 = v;
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
    idx[t * K + k] = best;
    tot += score(best);
  }
  for (std::int64_t k = 0; k < K; ++k) {
    A v = score(idx[t * K + k]);
    if (renorm) v /= (tot + A(1e-20));
    st(w + t * K + k, v * A(scaling));
  }
}

template <class S, class A>
__global__ void router_bwd_k(S* dlogits, const S* scores, const std::int64_t* idx, const S* dw, const S* dscores,
                             std::int64_t Tn, std::int64_t E, std::int64_t K, bool sig, bool renorm, double scaling) {
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= Tn) return;
  const S* sr = scores + t * E;
  S* dl = dlogits + t * E;
  const A sc = A(scaling);
  A sum = 0, dot = 0;
  for (std::int64_t k = 0; k < K; ++k) {
    sum += ld(sr + idx[t * K + k]);
    dot += ld(dw + t * K + k) * ld(sr + idx[t * K + k]);
  }
  sum += A(1e-20);
  // ds[e]: from the optional dscores plus the selected experts' weights.
  auto ds = [&](std::int64_t e) {
    A v = dscores ? A(ld(dscores + t * E + e)) : A(0);
    for (std::int64_t k = 0; k < K; ++k)
      if (idx[t * K + k] == e) v += renorm ? sc * (A(ld(dw + t * K + k)) / sum - dot / (sum * sum)) : sc * A(ld(dw + t * K + k));
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

// out row r = in row map[r] (a gather), C channels.
template <class S> __global__ void gather_rows_k(S* out, const S* in, const std::int64_t* map, std::int64_t rows, std::int64_t C,
                                                 std::int64_t div) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * C) out[i] = in[(map[i / C] / div) * C + i % C];
}
// y[t] = sum_k w[t,k] * yp[inv[t*K+k]] (w = nullptr: weight 1).
template <class S, class A>
__global__ void combine_k(S* y, const S* yp, const std::int64_t* inv, const S* w, std::int64_t Tn, std::int64_t K,
                          std::int64_t C) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= Tn * C) return;
  const std::int64_t t = i / C, c = i % C;
  A acc = 0;
  for (std::int64_t k = 0; k < K; ++k) acc += (w ? A(ld(w + t * K + k)) : A(1)) * ld(yp + inv[t * K + k] * C + c);
  st(y + i, acc);
}
// One warp per permuted row r: dyp[r] = w[a] dy[t], dw[a] = dy[t] . yp[r].
template <class S, class A>
__global__ void combine_bwd_k(S* dyp, S* dw, const S* dy, const S* yp, const std::int64_t* src, const S* w, std::int64_t TK,
                              std::int64_t K, std::int64_t C) {
  const std::int64_t r = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= TK) return;
  const std::int64_t a = src[r], t = a / K;
  const A wa = ld(w + a);
  A dot = 0;
  for (std::int64_t c = lane; c < C; c += 32) {
    const A g = ld(dy + t * C + c);
    st(dyp + r * C + c, wa * g);
    dot += g * ld(yp + r * C + c);
  }
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  if (lane == 0) st(dw + a, dot);
}
// a = act(h): squared ReLU (F1 = F) or SwiGLU (gate rows then up rows, F1 = 2F).
template <class S, class A> __global__ void act_k(S* a, const S* h, std::int64_t rows, std::int64_t F, bool swiglu) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * F) return;
  const std::int64_t r = i / F, f = i % F, F1 = swiglu ? 2 * F : F;
  const A x = ld(h + r * F1 + f);
  st(a + i, swiglu ? silu_(x) * A(ld(h + r * F1 + F + f)) : (x > A(0) ? x * x : A(0)));
}
template <class S, class A> __global__ void act_bwd_k(S* dh, const S* da, const S* h, std::int64_t rows, std::int64_t F, bool swiglu) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * F) return;
  const std::int64_t r = i / F, f = i % F, F1 = swiglu ? 2 * F : F;
  const A g = ld(da + i), x = ld(h + r * F1 + f);
  if (swiglu) {
    const A u = ld(h + r * F1 + F + f);
    st(dh + r * F1 + f, g * u * dsilu_(x));
    st(dh + r * F1 + F + f, g * silu_(x));
  } else {
    st(dh + r * F1 + f, x > A(0) ? g * A(2) * x : A(0));
  }
}

// Load-balancing loss per token: part[t] = sum_e f_e s_te / sum_e s_te; backward adds
// k (f_e - inner_t) / sum_t into dscores.
template <class S, class A>
__global__ void aux_k(double* part, S* dscores, const S* scores, const double* f, std::int64_t Tn, std::int64_t E, double k) {
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (t >= Tn) return;
  double sum = 0, inner = 0;
  for (std::int64_t e = 0; e < E; ++e) sum += static_cast<double>(ld(scores + t * E + e));
  for (std::int64_t e = 0; e < E; ++e) inner += f[e] * static_cast<double>(ld(scores + t * E + e)) / sum;
  if (part) part[t] = inner;
  if (dscores)
    for (std::int64_t e = 0; e < E; ++e) {
      S* d = dscores + t * E + e;
      st(d, A(static_cast<double>(ld(d)) + k * (f[e] - inner) / sum));
    }
}

std::vector<std::int64_t> inverse(const std::vector<std::int64_t>& src) {
  std::vector<std::int64_t> inv(src.size());
  for (std::size_t r = 0; r < src.size(); ++r) inv[static_cast<std::size_t>(src[r])] = static_cast<std::int64_t>(r);
  return inv;
}
void same_dtype(std::initializer_list<const Tensor*> ts, const char* what) {
  const DType d = (*ts.begin())->dtype();
  for (const Tensor* t : ts)
    if (t) {
      require_cuda(*t, what);
      HCP_CHECK(t->dtype() == d, what, ": every tensor must have the dtype ", to_string(d));
    }
}
}  // namespace

void router_fwd(Tensor& scores, std::vector<std::int64_t>& topk_idx, Tensor& topk_w, const Tensor& logits,
                const Tensor* bias, const RouterParams& p) {
  same_dtype({&logits, &scores, &topk_w, bias}, "router_fwd");
  HCP_CHECK(p.experts <= kMaxE && p.n_group <= 64, "router (CUDA): at most ", kMaxE, " experts and 64 groups");
  const std::int64_t Tn = logits.size(0), E = p.experts, K = p.topk;
  topk_idx.assign(static_cast<std::size_t>(Tn * K), 0);
  if (Tn == 0) return;
  const DeviceIndex ibuf(nullptr, static_cast<std::size_t>(Tn * K));
  std::int64_t* idx = ibuf.p;
  HCP_CUDA_DISPATCH(logits, {
    using A = typename Acc<S>::type;
    router_fwd_k<S, A><<<blocks_for(Tn, 128), 128>>>(dptr<S>(scores), idx, dptr<S>(topk_w), dptr<S>(logits),
                                                     bias ? dptr<S>(*bias) : nullptr, Tn, E, K, p.sigmoid, p.n_group,
                                                     p.topk_group, p.renormalize, p.scaling);
  });
  check_launch("router_fwd");
  HCP_CUDA_CHECK(cudaMemcpy(topk_idx.data(), idx, topk_idx.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost));
}

void router_bwd(Tensor& dlogits, const Tensor& scores, const std::vector<std::int64_t>& topk_idx, const Tensor& dtopk_w,
                const Tensor* dscores, const RouterParams& p) {
  same_dtype({&scores, &dlogits, &dtopk_w, dscores}, "router_bwd");
  const std::int64_t E = p.experts, K = p.topk, Tn = scores.numel() / E;
  if (Tn == 0) return;
  DeviceIndex idx(&topk_idx);
  HCP_CUDA_DISPATCH(scores, {
    using A = typename Acc<S>::type;
    router_bwd_k<S, A><<<blocks_for(Tn, 128), 128>>>(dptr<S>(dlogits), dptr<S>(scores), idx.p, dptr<S>(dtopk_w),
                                                     dscores ? dptr<S>(*dscores) : nullptr, Tn, E, K, p.sigmoid,
                                                     p.renormalize, p.scaling);
  });
  check_launch("router_bwd");
}

void moe_permute_rows(Tensor& xp, const Tensor& x, const std::vector<std::int64_t>& src, std::int64_t topk) {
  same_dtype({&x, &xp}, "moe_permute");
  const std::int64_t TK = static_cast<std::int64_t>(src.size()), C = x.size(1);
  if (TK == 0) return;
  DeviceIndex map(&src);
  HCP_CUDA_DISPATCH(x, gather_rows_k<S><<<blocks_for(TK * C, kThreads), kThreads>>>(dptr<S>(xp), dptr<S>(x), map.p, TK, C, topk));
  check_launch("moe_permute");
}

void moe_permute_bwd(Tensor& dx, const Tensor& dxp, const std::vector<std::int64_t>& src, std::int64_t topk) {
  same_dtype({&dxp, &dx}, "moe_permute_bwd");
  const std::int64_t TK = static_cast<std::int64_t>(src.size()), Tn = TK / topk, C = dxp.numel() / std::max<std::int64_t>(TK, 1);
  if (TK == 0) return;
  const std::vector<std::int64_t> src_inv = inverse(src);
  DeviceIndex inv(&src_inv);
  HCP_CUDA_DISPATCH(dxp, {
    using A = typename Acc<S>::type;
    combine_k<S, A><<<blocks_for(Tn * C, kThreads), kThreads>>>(dptr<S>(dx), dptr<S>(dxp), inv.p, nullptr, Tn, topk, C);
  });
  check_launch("moe_permute_bwd");
}

void moe_combine_fwd(Tensor& y, const Tensor& yp, const std::vector<std::int64_t>& src, const Tensor& topk_w) {
  same_dtype({&yp, &y, &topk_w}, "moe_combine_fwd");
  const std::int64_t TK = static_cast<std::int64_t>(src.size()), C = yp.numel() / TK,
                     K = topk_w.dim() == 2 ? topk_w.size(1) : 1, Tn = TK / K;
  const std::vector<std::int64_t> src_inv = inverse(src);
  DeviceIndex inv(&src_inv);
  HCP_CUDA_DISPATCH(yp, {
    using A = typename Acc<S>::type;
    combine_k<S, A><<<blocks_for(Tn * C, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(yp), inv.p, dptr<S>(topk_w), Tn, K, C);
  });
  check_launch("moe_combine_fwd");
}

void moe_combine_bwd(Tensor& dyp, Tensor& dtopk_w, const Tensor& dy, const Tensor& yp, const std::vector<std::int64_t>& src,
                     const Tensor& topk_w) {
  same_dtype({&yp, &dyp, &dtopk_w, &dy, &topk_w}, "moe_combine_bwd");
  const std::int64_t TK = static_cast<std::int64_t>(src.size()), C = yp.numel() / TK,
                     K = topk_w.dim() == 2 ? topk_w.size(1) : 1;
  DeviceIndex s(&src);
  HCP_CUDA_DISPATCH(yp, {
    using A = typename Acc<S>::type;
    combine_bwd_k<S, A><<<blocks_for(TK * 32, kThreads), kThreads>>>(dptr<S>(dyp), dptr<S>(dtopk_w), dptr<S>(dy),
                                                                     dptr<S>(yp), s.p, dptr<S>(topk_w), TK, K, C);
  });
  check_launch("moe_combine_bwd");
}

namespace {
// Share of assignments per expert (host, from the host index vector).
std::vector<double> expert_shares(const std::vector<std::int64_t>& idx, std::int64_t E) {
  std::vector<double> h(static_cast<std::size_t>(E), 0.0);
  for (auto e : idx) h[static_cast<std::size_t>(e)] += 1.0;
  for (auto& v : h) v /= static_cast<double>(idx.size());
  return h;
}
}  // namespace

double moe_aux_loss_fwd(const Tensor& scores, const std::vector<std::int64_t>& topk_idx, const RouterParams& p) {
  same_dtype({&scores}, "moe_aux_loss_fwd");
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
  const std::vector<double> shares = expert_shares(topk_idx, E);
  DeviceArray<double> sh(&shares);
  const DeviceArray<double> pbuf(nullptr, static_cast<std::size_t>(Tn));
  double* part = pbuf.p;
  HCP_CUDA_DISPATCH(scores, {
    using A = typename Acc<S>::type;
    aux_k<S, A><<<blocks_for(Tn, 128), 128>>>(part, static_cast<S*>(nullptr), dptr<S>(scores), sh.p, Tn, E, 0.0);
  });
  check_launch("moe_aux_loss_fwd");
  std::vector<double> h(static_cast<std::size_t>(Tn));
  HCP_CUDA_CHECK(cudaMemcpy(h.data(), part, h.size() * sizeof(double), cudaMemcpyDeviceToHost));
  double loss = 0;  // in token order, as the host does
  for (double v : h) loss += v;
  return static_cast<double>(E) * loss / static_cast<double>(Tn);
}

void moe_aux_loss_bwd(Tensor& dscores, const Tensor& scores, const std::vector<std::int64_t>& topk_idx,
                      const RouterParams& p, double dloss) {
  same_dtype({&scores, &dscores}, "moe_aux_loss_bwd");
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
  const std::vector<double> shares = expert_shares(topk_idx, E);
  DeviceArray<double> sh(&shares);
  HCP_CUDA_DISPATCH(scores, {
    using A = typename Acc<S>::type;
    aux_k<S, A><<<blocks_for(Tn, 128), 128>>>(nullptr, dptr<S>(dscores), dptr<S>(scores), sh.p, Tn, E,
                                              dloss * static_cast<double>(E) / static_cast<double>(Tn));
  });
  check_launch("moe_aux_loss_bwd");
}

namespace {
// One group per expert over its consecutive rows. rows_grouped: C_e = rows of X (x ld) times weight e
// (trans: weight [N,K] used as W^T); else (weight gradients) C_e [M,N] = X_e^T Y_e summed over the rows.
std::vector<GemmGroupDesc> per_expert(const std::vector<std::int64_t>& counts, std::size_t es, const void* a, std::int64_t lda,
                                      const void* b, std::int64_t ldb, void* c, std::int64_t ldc, std::int64_t M,
                                      std::int64_t N, std::int64_t K, bool rows_grouped, std::int64_t wstride) {
  std::vector<GemmGroupDesc> g;
  std::int64_t r0 = 0;
  for (std::size_t e = 0; e < counts.size(); ++e) {
    const std::int64_t n = counts[e];
    const auto at = [&](const void* p, std::int64_t off) {
      return static_cast<char*>(const_cast<void*>(p)) + static_cast<std::size_t>(off) * es;
    };
    const std::int64_t we = static_cast<std::int64_t>(e) * wstride;
    if (rows_grouped)
      g.push_back({at(a, r0 * lda), at(b, we), at(c, r0 * ldc), n, N, K, lda, ldb, ldc});
    else
      g.push_back({at(a, r0 * lda), at(b, r0 * ldb), at(c, we), M, N, n, lda, ldb, ldc});
    r0 += n;
  }
  return g;
}
std::int64_t total_rows(const std::vector<std::int64_t>& counts) {
  std::int64_t rows = 0;
  for (auto c : counts) rows += c;
  return rows;
}
}  // namespace

void expert_mlp_fwd(Tensor& yp, Tensor& h, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const std::vector<std::int64_t>& counts, Activation act) {
  same_dtype({&xp, &yp, &h, &W1, &W2}, "expert_mlp_fwd");
  const DType dt = xp.dtype();
  const std::int64_t F1 = W1.size(1), C = W1.size(2), F = W2.size(2), rows = total_rows(counts);
  const std::size_t es = dtype_size(dt);
  Tensor a = Tensor::empty({std::max<std::int64_t>(rows, 1), F}, dt, Space::Cuda);
  // h = x W1_e^T, a = act(h), y = a W2_e^T
  grouped_gemm(false, true, per_expert(counts, es, xp.raw(), C, W1.raw(), C, h.raw(), F1, 0, F1, C, true, F1 * C), dt);
  HCP_CUDA_DISPATCH(xp, {
    using A = typename Acc<S>::type;
    if (rows > 0)
      act_k<S, A><<<blocks_for(rows * F, kThreads), kThreads>>>(dptr<S>(a), dptr<S>(h), rows, F, act == Activation::SwiGLU);
  });
  check_launch("expert_mlp_fwd");
  grouped_gemm(false, true, per_expert(counts, es, a.raw(), F, W2.raw(), F, yp.raw(), C, 0, C, F, true, C * F), dt);
  HCP_CUDA_CHECK(cudaDeviceSynchronize());
}

void expert_mlp_bwd(Tensor& dxp, Tensor& dW1, Tensor& dW2, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const Tensor& h, const std::vector<std::int64_t>& counts, Activation act, const Tensor& dyp) {
  same_dtype({&xp, &dxp, &dW1, &dW2, &W1, &W2, &h, &dyp}, "expert_mlp_bwd");
  const DType dt = xp.dtype();
  const std::int64_t F1 = W1.size(1), C = W1.size(2), F = W2.size(2), rows = total_rows(counts);
  const std::size_t es = dtype_size(dt);
  const std::int64_t R = std::max<std::int64_t>(rows, 1);
  Tensor a = Tensor::empty({R, F}, dt, Space::Cuda), da = Tensor::empty({R, F}, dt, Space::Cuda),
         dh = Tensor::empty({R, F1}, dt, Space::Cuda);
  const bool sw = act == Activation::SwiGLU;
  HCP_CUDA_DISPATCH(xp, {
    using A = typename Acc<S>::type;
    if (rows > 0) act_k<S, A><<<blocks_for(rows * F, kThreads), kThreads>>>(dptr<S>(a), dptr<S>(h), rows, F, sw);
  });
  check_launch("expert_mlp_bwd");
  grouped_gemm(false, false, per_expert(counts, es, dyp.raw(), C, W2.raw(), F, da.raw(), F, 0, F, C, true, C * F), dt);  // da = dy W2_e
  grouped_gemm(true, false, per_expert(counts, es, dyp.raw(), C, a.raw(), F, dW2.raw(), F, C, F, 0, false, C * F), dt);  // dW2_e = dy^T a
  HCP_CUDA_DISPATCH(xp, {
    using A = typename Acc<S>::type;
    if (rows > 0)
      act_bwd_k<S, A><<<blocks_for(rows * F, kThreads), kThreads>>>(dptr<S>(dh), dptr<S>(da), dptr<S>(h), rows, F, sw);
  });
  check_launch("expert_mlp_bwd");
  grouped_gemm(false, false, per_expert(counts, es, dh.raw(), F1, W1.raw(), C, dxp.raw(), C, 0, C, F1, true, F1 * C), dt);  // dx = dh W1_e
  grouped_gemm(true, false, per_expert(counts, es, dh.raw(), F1, xp.raw(), C, dW1.raw(), C, F1, C, 0, false, F1 * C), dt);  // dW1_e = dh^T x
  HCP_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace hcp::kernels::cuda_impl
