// CUDA dense layers (cuBLAS, no TF32), bias, elementwise add / axpy, RoPE, embedding and
// cross-entropy (host twin: kernels/host/dense.cpp). Fixed reduction orders: bitwise repeatable.
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

// ---- elementwise, bias, RoPE, embedding, cross-entropy ------------------------------------------
template <class S>
__global__ void add_k(S* y, const S* a, const S* b, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) st(y + i, ld(a + i) + ld(b + i));
}
// y may be a wider accumulator than x (fp32 y += bf16 x).
template <class SY, class SX>
__global__ void axpy_k(SY* y, double alpha, const SX* x, std::int64_t n) {
  using A = typename Acc<SY>::type;
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) st(y + i, ld(y + i) + A(alpha) * ld(x + i));
}
template <class S>
__global__ void bias_add_k(S* y, const S* bias, std::int64_t M, std::int64_t N) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < M * N) st(y + i, ld(y + i) + ld(bias + i % N));
}
template <class S>
__global__ void col_sum_k(S* out, const S* dy, std::int64_t M, std::int64_t N) {
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
__global__ void embed_bwd_k(S* dtable, const S* dy, const std::int64_t* start, const std::int64_t* order,
                            std::int64_t V, std::int64_t C) {
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

cudaDataType_t cuda_type(DType d) { return d == DType::F64 ? CUDA_R_64F : d == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }
cublasComputeType_t compute_type(DType d) { return d == DType::F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F; }
// C (col-major m x n, ldc) = op(A) op(B), alpha 1, beta 0.
void gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k, const void* A,
          std::int64_t lda, const void* B, std::int64_t ldb, void* C, std::int64_t ldc, DType dt) {
  const double one64 = 1, zero64 = 0;
  const float one32 = 1, zero32 = 0;
  const void* alpha = dt == DType::F64 ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  const void* beta = dt == DType::F64 ? static_cast<const void*>(&zero64) : static_cast<const void*>(&zero32);
  const cudaDataType_t t = cuda_type(dt);
  HCP_CUBLAS_CHECK(cublasGemmEx(cublas(), ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha,
                                A, t, static_cast<int>(lda), B, t, static_cast<int>(ldb), beta, C, t,
                                static_cast<int>(ldc), compute_type(dt), CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void linear_fwd(Tensor& y, const Tensor& x, const Tensor& W, const Tensor* bias) {
  check_all({&y, &x, &W, bias}, x.dtype(), "linear_fwd");
  const std::int64_t N = W.size(0), K = W.size(1), M = x.numel() / K;
  if (M == 0 || N == 0) return;
  // Row-major y[M,N] = x[M,K] W^T is column-major y^T = (W^T)^T x^T.
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, W.raw(), K, x.raw(), K, y.raw(), N, x.dtype());
  if (bias)
    HCP_CUDA_DISPATCH(x, bias_add_k<S><<<blocks_for(M * N, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(*bias), M, N));
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
    if (M == 0)
      HCP_CUDA_CHECK(cudaMemset(dW->raw(), 0, dW->nbytes()));
    else
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x.raw(), K, dy.raw(), N, dW->raw(), K, x.dtype());  // dW = dy^T x
  }
  if (dbias)
    HCP_CUDA_DISPATCH(x, col_sum_k<S><<<blocks_for(N, kThreads), kThreads>>>(dptr<S>(*dbias), dptr<S>(dy), M, N));
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
        rope_vec_k<S, std::int64_t>
            <<<blocks, kThreads, smem>>>(dptr<S>(y), dptr<S>(x), pos.p, freq, sign, T, H, D, rd, tpb);
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
  HCP_CUDA_DISPATCH(table,
                    embed_fwd_k<S><<<blocks_for(T * C, kThreads), kThreads>>>(dptr<S>(y), dptr<S>(table), id.p, T, C));
  check_launch("embedding_fwd");
}

void embedding_bwd(Tensor& dtable, const std::vector<std::int64_t>& ids, const Tensor& dy) {
  check_all({&dtable, &dy}, dy.dtype(), "embedding_bwd");
  const std::int64_t V = dtable.size(0), C = dtable.size(1), T = static_cast<std::int64_t>(ids.size());
  std::vector<std::int64_t> start(static_cast<std::size_t>(V + 1), 0),
      order(static_cast<std::size_t>(std::max<std::int64_t>(T, 1)));
  for (auto v : ids) start[static_cast<std::size_t>(v + 1)]++;
  for (std::int64_t v = 0; v < V; ++v) start[static_cast<std::size_t>(v + 1)] += start[static_cast<std::size_t>(v)];
  std::vector<std::int64_t> fill(start.begin(), start.end() - 1);
  for (std::int64_t t = 0; t < T; ++t)
    order[static_cast<std::size_t>(fill[static_cast<std::size_t>(ids[static_cast<std::size_t>(t)])]++)] = t;
  DeviceIndex st_(&start), ord(&order);
  HCP_CUDA_DISPATCH(
      dy, embed_bwd_k<S><<<blocks_for(V * C, kThreads), kThreads>>>(dptr<S>(dtable), dptr<S>(dy), st_.p, ord.p, V, C));
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

void cross_entropy_bwd(Tensor& dlogits, const Tensor& logits, const std::vector<std::int64_t>& labels,
                       std::int64_t ignore, double scale) {
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
  const std::int64_t n = x.numel();
  if (y.dtype() == DType::F32 && x.dtype() == DType::BF16) {  // fp32 accumulator, bf16 addend
    check_all({&y}, DType::F32, "axpy");
    check_all({&x}, DType::BF16, "axpy");
    if (n)
      axpy_k<float, __nv_bfloat16>
          <<<blocks_for(n, kThreads), kThreads>>>(dptr<float>(y), alpha, dptr<__nv_bfloat16>(x), n);
  } else {
    check_all({&y, &x}, x.dtype(), "axpy");
    if (n) HCP_CUDA_DISPATCH(x, axpy_k<S, S><<<blocks_for(n, kThreads), kThreads>>>(dptr<S>(y), alpha, dptr<S>(x), n));
  }
  check_launch("axpy");
}

}  // namespace hcp::kernels::cuda_impl
