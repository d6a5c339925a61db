// MoE on the GPU: router (sigmoid/softmax scores, selection by score + correction bias, group-limited
// top-k, renormalisation, scaling) with one thread per token, its backward; permute / combine and
// their backward as gathers with one owner per output (the row maps are built on the host, as the
// token->expert assignment is a host vector in the kernel API); expert MLPs with cuBLAS per expert
// (squared ReLU or SwiGLU between the two GEMMs). A single grouped-GEMM launch is performance work.
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

cudaDataType_t cuda_type(DType d) { return d == DType::F64 ? CUDA_R_64F : d == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }
// Row-major C[m,n] = op(A) op(B) with alpha 1 and beta (0 or 1), as cuBLAS column-major calls.
// trans_a: A is [k,m] (use A^T); else [m,k]. trans_b: B is [n,k] (use B^T); else [k,n].
void gemm_rm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* A, const void* B,
             void* C, DType dt, bool accumulate) {
  if (m == 0 || n == 0) return;
  const double one64 = 1, b64 = accumulate ? 1 : 0;
  const float one32 = 1, b32 = accumulate ? 1 : 0;
  const void* alpha = dt == DType::F64 ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  const void* beta = dt == DType::F64 ? static_cast<const void*>(&b64) : static_cast<const void*>(&b32);
  // Column-major C^T [n,m] = op(B)^T op(A)^T.
  const cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const std::int64_t ldb = trans_b ? k : n, lda = trans_a ? m : k;
  HCP_CUBLAS_CHECK(cublasGemmEx(cublas(), ob, oa, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), alpha, B,
                                cuda_type(dt), static_cast<int>(ldb), A, cuda_type(dt), static_cast<int>(lda), beta, C,
                                cuda_type(dt), static_cast<int>(n),
                                dt == DType::F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
struct Idx {
  std::int64_t* p = nullptr;
  explicit Idx(const std::vector<std::int64_t>& v) {
    if (v.empty()) return;
    HCP_CUDA_CHECK(cudaMalloc(&p, v.size() * sizeof(std::int64_t)));
    HCP_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice));
  }
  ~Idx() {
    cudaDeviceSynchronize();
    cudaFree(p);
  }
  Idx(const Idx&) = delete;
  Idx& operator=(const Idx&) = delete;
};
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
  std::int64_t* idx = nullptr;
  HCP_CUDA_CHECK(cudaMalloc(&idx, static_cast<std::size_t>(Tn * K) * sizeof(std::int64_t)));
  HCP_CUDA_DISPATCH(logits, {
    using A = typename Acc<S>::type;
    router_fwd_k<S, A><<<blocks_for(Tn, 128), 128>>>(dptr<S>(scores), idx, dptr<S>(topk_w), dptr<S>(logits),
                                                     bias ? dptr<S>(*bias) : nullptr, Tn, E, K, p.sigmoid, p.n_group,
                                                     p.topk_group, p.renormalize, p.scaling);
  });
  check_launch("router_fwd");
  HCP_CUDA_CHECK(cudaMemcpy(topk_idx.data(), idx, topk_idx.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost));
  cudaFree(idx);
}

void router_bwd(Tensor& dlogits, const Tensor& scores, const std::vector<std::int64_t>& topk_idx, const Tensor& dtopk_w,
                const Tensor* dscores, const RouterParams& p) {
  same_dtype({&scores, &dlogits, &dtopk_w, dscores}, "router_bwd");
  const std::int64_t E = p.experts, K = p.topk, Tn = scores.numel() / E;
  if (Tn == 0) return;
  Idx idx(topk_idx);
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
  Idx map(src);
  HCP_CUDA_DISPATCH(x, gather_rows_k<S><<<blocks_for(TK * C, kThreads), kThreads>>>(dptr<S>(xp), dptr<S>(x), map.p, TK, C, topk));
  check_launch("moe_permute");
}

void moe_permute_bwd(Tensor& dx, const Tensor& dxp, const std::vector<std::int64_t>& src, std::int64_t topk) {
  same_dtype({&dxp, &dx}, "moe_permute_bwd");
  const std::int64_t TK = static_cast<std::int64_t>(src.size()), Tn = TK / topk, C = dxp.numel() / std::max<std::int64_t>(TK, 1);
  if (TK == 0) return;
  Idx inv(inverse(src));
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
  Idx inv(inverse(src));
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
  Idx s(src);
  HCP_CUDA_DISPATCH(yp, {
    using A = typename Acc<S>::type;
    combine_bwd_k<S, A><<<blocks_for(TK * 32, kThreads), kThreads>>>(dptr<S>(dyp), dptr<S>(dtopk_w), dptr<S>(dy),
                                                                     dptr<S>(yp), s.p, dptr<S>(topk_w), TK, K, C);
  });
  check_launch("moe_combine_bwd");
}

namespace {
// Share of assignments per expert (host, from the host index vector), on the device.
struct Shares {
  double* f = nullptr;
  Shares(const std::vector<std::int64_t>& idx, std::int64_t E) {
    std::vector<double> h(static_cast<std::size_t>(E), 0.0);
    for (auto e : idx) h[static_cast<std::size_t>(e)] += 1.0;
    for (auto& v : h) v /= static_cast<double>(idx.size());
    HCP_CUDA_CHECK(cudaMalloc(&f, h.size() * sizeof(double)));
    HCP_CUDA_CHECK(cudaMemcpy(f, h.data(), h.size() * sizeof(double), cudaMemcpyHostToDevice));
  }
  ~Shares() {
    cudaDeviceSynchronize();
    cudaFree(f);
  }
  Shares(const Shares&) = delete;
  Shares& operator=(const Shares&) = delete;
};
}  // namespace

double moe_aux_loss_fwd(const Tensor& scores, const std::vector<std::int64_t>& topk_idx, const RouterParams& p) {
  same_dtype({&scores}, "moe_aux_loss_fwd");
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
  Shares sh(topk_idx, E);
  double* part = nullptr;
  HCP_CUDA_CHECK(cudaMalloc(&part, static_cast<std::size_t>(Tn) * sizeof(double)));
  HCP_CUDA_DISPATCH(scores, {
    using A = typename Acc<S>::type;
    aux_k<S, A><<<blocks_for(Tn, 128), 128>>>(part, static_cast<S*>(nullptr), dptr<S>(scores), sh.f, Tn, E, 0.0);
  });
  check_launch("moe_aux_loss_fwd");
  std::vector<double> h(static_cast<std::size_t>(Tn));
  HCP_CUDA_CHECK(cudaMemcpy(h.data(), part, h.size() * sizeof(double), cudaMemcpyDeviceToHost));
  cudaFree(part);
  double loss = 0;  // in token order, as the host does
  for (double v : h) loss += v;
  return static_cast<double>(E) * loss / static_cast<double>(Tn);
}

void moe_aux_loss_bwd(Tensor& dscores, const Tensor& scores, const std::vector<std::int64_t>& topk_idx,
                      const RouterParams& p, double dloss) {
  same_dtype({&scores, &dscores}, "moe_aux_loss_bwd");
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
  Shares sh(topk_idx, E);
  HCP_CUDA_DISPATCH(scores, {
    using A = typename Acc<S>::type;
    aux_k<S, A><<<blocks_for(Tn, 128), 128>>>(nullptr, dptr<S>(dscores), dptr<S>(scores), sh.f, Tn, E,
                                              dloss * static_cast<double>(E) / static_cast<double>(Tn));
  });
  check_launch("moe_aux_loss_bwd");
}

void expert_mlp_fwd(Tensor& yp, Tensor& h, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const std::vector<std::int64_t>& counts, Activation act) {
  same_dtype({&xp, &yp, &h, &W1, &W2}, "expert_mlp_fwd");
  const DType dt = xp.dtype();
  const std::int64_t E = W1.size(0), F1 = W1.size(1), C = W1.size(2), F = W2.size(2);
  const std::size_t es = dtype_size(dt);
  std::int64_t rows = 0;
  for (auto c : counts) rows += c;
  Tensor a = Tensor::empty({std::max<std::int64_t>(rows, 1), F}, dt, Space::Cuda);
  const bool sw = act == Activation::SwiGLU;
  std::int64_t r0 = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t n = counts[static_cast<std::size_t>(e)];
    if (n == 0) continue;
    const char* x = static_cast<const char*>(xp.raw()) + static_cast<std::size_t>(r0 * C) * es;
    char* hp = static_cast<char*>(h.raw()) + static_cast<std::size_t>(r0 * F1) * es;
    char* ap = static_cast<char*>(a.raw()) + static_cast<std::size_t>(r0 * F) * es;
    char* yr = static_cast<char*>(yp.raw()) + static_cast<std::size_t>(r0 * C) * es;
    gemm_rm(false, true, n, F1, C, x, static_cast<const char*>(W1.raw()) + static_cast<std::size_t>(e * F1 * C) * es, hp, dt, false);
    HCP_CUDA_DISPATCH(xp, {
      using A = typename Acc<S>::type;
      act_k<S, A><<<blocks_for(n * F, kThreads), kThreads>>>(reinterpret_cast<S*>(ap), reinterpret_cast<const S*>(hp), n, F, sw);
    });
    gemm_rm(false, true, n, C, F, ap, static_cast<const char*>(W2.raw()) + static_cast<std::size_t>(e * C * F) * es, yr, dt, false);
    r0 += n;
  }
  check_launch("expert_mlp_fwd");
  HCP_CUDA_CHECK(cudaDeviceSynchronize());
}

void expert_mlp_bwd(Tensor& dxp, Tensor& dW1, Tensor& dW2, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const Tensor& h, const std::vector<std::int64_t>& counts, Activation act, const Tensor& dyp) {
  same_dtype({&xp, &dxp, &dW1, &dW2, &W1, &W2, &h, &dyp}, "expert_mlp_bwd");
  const DType dt = xp.dtype();
  const std::int64_t E = W1.size(0), F1 = W1.size(1), C = W1.size(2), F = W2.size(2);
  const std::size_t es = dtype_size(dt);
  std::int64_t rows = 0;
  for (auto c : counts) rows += c;
  HCP_CUDA_CHECK(cudaMemset(dW1.raw(), 0, dW1.nbytes()));
  HCP_CUDA_CHECK(cudaMemset(dW2.raw(), 0, dW2.nbytes()));
  Tensor a = Tensor::empty({std::max<std::int64_t>(rows, 1), F}, dt, Space::Cuda),
         da = Tensor::empty({std::max<std::int64_t>(rows, 1), F}, dt, Space::Cuda),
         dh = Tensor::empty({std::max<std::int64_t>(rows, 1), F1}, dt, Space::Cuda);
  const bool sw = act == Activation::SwiGLU;
  std::int64_t r0 = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t n = counts[static_cast<std::size_t>(e)];
    if (n == 0) continue;
    auto at = [&](const Tensor& t, std::int64_t width) {
      return static_cast<char*>(const_cast<void*>(t.raw())) + static_cast<std::size_t>(r0 * width) * es;
    };
    const char* w1 = static_cast<const char*>(W1.raw()) + static_cast<std::size_t>(e * F1 * C) * es;
    const char* w2 = static_cast<const char*>(W2.raw()) + static_cast<std::size_t>(e * C * F) * es;
    char* dw1 = static_cast<char*>(dW1.raw()) + static_cast<std::size_t>(e * F1 * C) * es;
    char* dw2 = static_cast<char*>(dW2.raw()) + static_cast<std::size_t>(e * C * F) * es;
    HCP_CUDA_DISPATCH(xp, {
      using A = typename Acc<S>::type;
      act_k<S, A><<<blocks_for(n * F, kThreads), kThreads>>>(reinterpret_cast<S*>(at(a, F)), reinterpret_cast<const S*>(at(h, F1)), n, F, sw);
    });
    gemm_rm(false, false, n, F, C, at(dyp, C), w2, at(da, F), dt, false);          // da = dy W2_e
    gemm_rm(true, false, C, F, n, at(dyp, C), at(a, F), dw2, dt, false);            // dW2_e = dy^T a
    HCP_CUDA_DISPATCH(xp, {
      using A = typename Acc<S>::type;
      act_bwd_k<S, A><<<blocks_for(n * F, kThreads), kThreads>>>(reinterpret_cast<S*>(at(dh, F1)), reinterpret_cast<const S*>(at(da, F)),
                                                                 reinterpret_cast<const S*>(at(h, F1)), n, F, sw);
    });
    gemm_rm(false, false, n, C, F1, at(dh, F1), w1, at(dxp, C), dt, false);         // dx = dh W1_e
    gemm_rm(true, false, F1, C, n, at(dh, F1), at(xp, C), dw1, dt, false);          // dW1_e = dh^T x
    r0 += n;
  }
  check_launch("expert_mlp_bwd");
  HCP_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace hcp::kernels::cuda_impl
