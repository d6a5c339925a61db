// MoE experts on the GPU: grouped expert MLPs (grouped_gemm.cu: one launch over all experts per
// GEMM) with squared ReLU or SwiGLU between them, 16 bytes per thread where rows allow; the
// load-balancing loss and its gradient.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels::cuda_impl {
using namespace hcp::cuda;

namespace {
constexpr int kThreads = 256;

// a = act(h): squared ReLU (F1 = F) or SwiGLU (gate rows then up rows, F1 = 2F).
template <class S, class A, int W>
__global__ void act_k(S* a, const S* h, std::int64_t rows, std::int64_t F, bool swiglu) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x, nv = F / W;
  if (i >= rows * nv) return;
  const std::int64_t r = i / nv, f = (i % nv) * W, F1 = swiglu ? 2 * F : F;
  A x[W], u[W], y[W];
  ldw<W>(x, h + r * F1 + f);
  if (swiglu) ldw<W>(u, h + r * F1 + F + f);
#pragma unroll
  for (int e = 0; e < W; ++e) y[e] = swiglu ? silu_(x[e]) * u[e] : (x[e] > A(0) ? x[e] * x[e] : A(0));
  stw<W>(a + r * F + f, y);
}
template <class S, class A, int W>
__global__ void act_bwd_k(S* dh, const S* da, const S* h, std::int64_t rows, std::int64_t F, bool swiglu) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x, nv = F / W;
  if (i >= rows * nv) return;
  const std::int64_t r = i / nv, f = (i % nv) * W, F1 = swiglu ? 2 * F : F;
  A g[W], x[W], u[W], d0[W], d1[W];
  ldw<W>(g, da + r * F + f);
  ldw<W>(x, h + r * F1 + f);
  if (swiglu) {
    ldw<W>(u, h + r * F1 + F + f);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      d0[e] = g[e] * u[e] * dsilu_(x[e]);
      d1[e] = g[e] * silu_(x[e]);
    }
    stw<W>(dh + r * F1 + f, d0);
    stw<W>(dh + r * F1 + F + f, d1);
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) d0[e] = x[e] > A(0) ? g[e] * A(2) * x[e] : A(0);
    stw<W>(dh + r * F1 + f, d0);
  }
}

// Load-balancing loss per token: part[t] = sum_e f_e s_te / sum_e s_te; backward adds
// k (f_e - inner_t) / sum_t into dscores.
template <class S, class A>
__global__ void aux_k(double* part, S* dscores, const S* scores, const double* f, std::int64_t Tn, std::int64_t E,
                      double k) {
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

}  // namespace

double moe_aux_loss_fwd(const Tensor& scores, const std::vector<double>& shares, const RouterParams& p) {
  check_same({&scores}, "moe_aux_loss_fwd");
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
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

void moe_aux_loss_bwd(Tensor& dscores, const Tensor& scores, const std::vector<double>& shares, const RouterParams& p,
                      double dloss) {
  check_same({&scores, &dscores}, "moe_aux_loss_bwd");
  const std::int64_t E = p.experts, Tn = scores.numel() / E;
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
std::vector<GemmGroupDesc> per_expert(const std::vector<std::int64_t>& counts, std::size_t es, const void* a,
                                      std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc,
                                      std::int64_t M, std::int64_t N, std::int64_t K, bool rows_grouped,
                                      std::int64_t wstride) {
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
  check_same({&xp, &yp, &h, &W1, &W2}, "expert_mlp_fwd");
  const DType dt = xp.dtype();
  const std::int64_t F1 = W1.size(1), C = W1.size(2), F = W2.size(2), rows = total_rows(counts);
  const std::size_t es = dtype_size(dt);
  Tensor a = Tensor::empty({std::max<std::int64_t>(rows, 1), F}, dt, Space::Cuda);
  // h = x W1_e^T, a = act(h), y = a W2_e^T
  grouped_gemm(false, true, per_expert(counts, es, xp.raw(), C, W1.raw(), C, h.raw(), F1, 0, F1, C, true, F1 * C), dt);
  HCP_CUDA_DISPATCH(xp, {
    using A = typename Acc<S>::type;
    if (rows > 0)
      with_width<S>({F}, {a.raw(), h.raw()}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        act_k<S, A, W><<<blocks_for(rows * F / W, kThreads), kThreads>>>(dptr<S>(a), dptr<S>(h), rows, F,
                                                                         act == Activation::SwiGLU);
      });
  });
  check_launch("expert_mlp_fwd");
  grouped_gemm(false, true, per_expert(counts, es, a.raw(), F, W2.raw(), F, yp.raw(), C, 0, C, F, true, C * F), dt);
}

void expert_mlp_bwd(Tensor& dxp, Tensor& dW1, Tensor& dW2, const Tensor& xp, const Tensor& W1, const Tensor& W2,
                    const Tensor& h, const std::vector<std::int64_t>& counts, Activation act, const Tensor& dyp) {
  check_same({&xp, &dxp, &dW1, &dW2, &W1, &W2, &h, &dyp}, "expert_mlp_bwd");
  const DType dt = xp.dtype();
  const std::int64_t F1 = W1.size(1), C = W1.size(2), F = W2.size(2), rows = total_rows(counts);
  const std::size_t es = dtype_size(dt);
  const std::int64_t R = std::max<std::int64_t>(rows, 1);
  const bool sw = act == Activation::SwiGLU;
  // One [rows, F] buffer at a time beside dh: a = act(h) is spent on dW2 and freed (stream-ordered)
  // before da is made, and squared ReLU writes dh over da. dyp's last reader is da's GEMM, before
  // dxp is written (dxp may be dyp).
  {
    Tensor a = Tensor::empty({R, F}, dt, Space::Cuda);
    HCP_CUDA_DISPATCH(xp, {
      using A = typename Acc<S>::type;
      if (rows > 0)
        with_width<S>({F}, {a.raw(), h.raw()}, [&](auto w) {
          constexpr int W = decltype(w)::value;
          act_k<S, A, W><<<blocks_for(rows * F / W, kThreads), kThreads>>>(dptr<S>(a), dptr<S>(h), rows, F, sw);
        });
    });
    check_launch("expert_mlp_bwd");
    grouped_gemm(true, false, per_expert(counts, es, dyp.raw(), C, a.raw(), F, dW2.raw(), F, C, F, 0, false, C * F),
                 dt);  // dW2_e = dy^T a
  }
  Tensor da = Tensor::empty({R, F}, dt, Space::Cuda);
  grouped_gemm(false, false, per_expert(counts, es, dyp.raw(), C, W2.raw(), F, da.raw(), F, 0, F, C, true, C * F),
               dt);                                               // da = dy W2_e
  Tensor dh = sw ? Tensor::empty({R, F1}, dt, Space::Cuda) : da;  // element-wise: in place is safe
  HCP_CUDA_DISPATCH(xp, {
    using A = typename Acc<S>::type;
    if (rows > 0)
      with_width<S>({F}, {dh.raw(), da.raw(), h.raw()}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        act_bwd_k<S, A, W>
            <<<blocks_for(rows * F / W, kThreads), kThreads>>>(dptr<S>(dh), dptr<S>(da), dptr<S>(h), rows, F, sw);
      });
  });
  check_launch("expert_mlp_bwd");
  da = Tensor();
  grouped_gemm(false, false, per_expert(counts, es, dh.raw(), F1, W1.raw(), C, dxp.raw(), C, 0, C, F1, true, F1 * C),
               dt);  // dx = dh W1_e
  grouped_gemm(true, false, per_expert(counts, es, dh.raw(), F1, xp.raw(), C, dW1.raw(), C, F1, C, 0, false, F1 * C),
               dt);  // dW1_e = dh^T x
}

}  // namespace hcp::kernels::cuda_impl
