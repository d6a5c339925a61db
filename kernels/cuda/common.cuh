// Shared device helpers of the CUDA kernels: typed loads/stores (bf16 storage, fp32 compute;
// fp64 stays fp64), block reductions, launch checks, and dispatch on the tensor dtype.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/tensor.hpp"

namespace hcp::cuda {

cublasHandle_t cublas();

template <class S>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ double ld(const double* p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(double* p, double v) { *p = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

template <class A>
__device__ __forceinline__ A sigmoid_(A x) {
  return A(1) / (A(1) + exp(-x));
}
template <class A>
__device__ __forceinline__ A silu_(A x) {
  return x * sigmoid_(x);
}
// SiLU with the hardware exponential and an approximate division for fp32 (a few ulp; bf16/fp32
// storage), exact for fp64; x / (1 + e^{-x}) tends to -0 for very negative x (e^{-x} = inf).
template <class A>
__device__ __forceinline__ A silu_fast(A x) {
  if constexpr (std::is_same_v<A, float>)
    return __fdividef(x, 1.f + __expf(-x));
  else
    return silu_(x);
}
template <class A>
__device__ __forceinline__ A dsilu_(A x) {
  const A s = sigmoid_(x);
  return s * (A(1) + x * (A(1) - s));
}

// 16-byte vector access: N = 16 / sizeof(S) elements (8 bf16, 4 fp32, 2 fp64) widened to A.
template <class S>
constexpr int kVec = 16 / static_cast<int>(sizeof(S));
template <class S, class A>
__device__ __forceinline__ void ld_vec(A (&v)[kVec<S>], const S* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const S* e = reinterpret_cast<const S*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec<S>; ++i) v[i] = ld(e + i);
}
template <class S, class A>
__device__ __forceinline__ void st_vec(S* p, const A (&v)[kVec<S>]) {
  uint4 raw;
  S* e = reinterpret_cast<S*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec<S>; ++i) st(e + i, v[i]);
  *reinterpret_cast<uint4*>(p) = raw;
}
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
// Row kernels that take W consecutive channels per thread: kVec<S> (16-byte accesses) when every row
// length and base pointer allows it (with_width), else 1; the arithmetic per element is the same.
template <int W, class S, class A>
__device__ __forceinline__ void ldw(A (&v)[W], const S* p) {
  if constexpr (W == kVec<S>)
    ld_vec<S, A>(v, p);
  else
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = ld(p + i);
}
template <int W, class S, class A>
__device__ __forceinline__ void stw(S* p, const A (&v)[W]) {
  if constexpr (W == kVec<S>)
    st_vec<S, A>(p, v);
  else
#pragma unroll
    for (int i = 0; i < W; ++i) st(p + i, v[i]);
}
// Calls launch(std::integral_constant<int, W>) with W = kVec<S> when every row length in `lens` is
// a multiple of it and every pointer 16-byte aligned, else W = 1.
template <class S, class L>
void with_width(std::initializer_list<std::int64_t> lens, std::initializer_list<const void*> ptrs, L&& launch) {
  bool vec = true;
  for (auto n : lens) vec = vec && n % kVec<S> == 0;
  for (auto p : ptrs) vec = vec && (p == nullptr || aligned16(p));
  if (vec)
    launch(std::integral_constant<int, kVec<S>>{});
  else
    launch(std::integral_constant<int, 1>{});
}

// Sum / maximum over the warp (butterfly: every lane gets the same result).
template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <class A>
__device__ A block_sum(A v) {
  __shared__ A warp_sums[32];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) warp_sums[wid] = v;
  __syncthreads();
  const int nw = (blockDim.x + 31) >> 5;
  return warp_sum(lane < nw ? warp_sums[lane] : A(0));
}

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) HCP_FAIL(what, ": kernel launch failed: ", cudaGetErrorString(e));
}
inline unsigned blocks_for(std::int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }
// Opt a kernel in to more than the default 48 KiB of dynamic shared memory when it needs it.
template <class K>
void allow_smem(K kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    HCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Device copy of a host vector or of n host elements (nullptr for nullptr or empty; data == nullptr:
// n uninitialised elements of scratch), stream-ordered on the default stream: kernels launched before
// the holder dies may use it; freeing it does not wait for them.
template <class X>
struct DeviceArray {
  X* p = nullptr;
  DeviceArray() = default;
  explicit DeviceArray(const std::vector<X>* v) : DeviceArray(v ? v->data() : nullptr, v ? v->size() : 0) {}
  DeviceArray(const X* data, std::size_t n) {
    if (n == 0) return;
    HCP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p), n * sizeof(X), 0));
    // From pageable memory, cudaMemcpyAsync has read the source when it returns.
    if (data) HCP_CUDA_CHECK(cudaMemcpyAsync(p, data, n * sizeof(X), cudaMemcpyHostToDevice, 0));
  }
  ~DeviceArray() {
    if (p) cudaFreeAsync(p, 0);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};
using DeviceIndex = DeviceArray<std::int64_t>;

inline void require_cuda(const Tensor& t, const char* what) {
  HCP_CHECK(t.defined() && t.space() == Space::Cuda, what, ": expected a CUDA tensor");
  HCP_CHECK(t.is_contiguous(), what, ": tensor must be contiguous, shape ", shape_str(t.shape()));
}
// Every non-null tensor on the GPU with dtype dt (the first input's), or an error naming `what`.
inline void check_all(std::initializer_list<const Tensor*> ts, DType dt, const char* what) {
  for (const Tensor* t : ts)
    if (t) {
      require_cuda(*t, what);
      HCP_CHECK(t->dtype() == dt, what, ": every tensor must have the dtype of the first input (", to_string(dt),
                "), got ", to_string(t->dtype()));
    }
}
// Every non-null tensor on the GPU and contiguous, with the first one's dtype.
inline void check_same(std::initializer_list<const Tensor*> ts, const char* what) {
  check_all(ts, (*ts.begin())->dtype(), what);
}
template <class S>
S* dptr(Tensor& t) {
  return static_cast<S*>(t.raw());
}
template <class S>
const S* dptr(const Tensor& t) {
  return static_cast<const S*>(t.raw());
}

}  // namespace hcp::cuda

// Runs the statement with S = the storage type of `ref` (float, double or __nv_bfloat16).
#define HCP_CUDA_DISPATCH(ref, ...) \
  do {                              \
    switch ((ref).dtype()) {        \
      case ::hcp::DType::F64: {     \
        using S = double;           \
        __VA_ARGS__;                \
      } break;                      \
      case ::hcp::DType::F32: {     \
        using S = float;            \
        __VA_ARGS__;                \
      } break;                      \
      default: {                    \
        using S = __nv_bfloat16;    \
        __VA_ARGS__;                \
      } break;                      \
    }                               \
  } while (0)
