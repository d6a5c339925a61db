// The reduction of the CUDA IPC communicator: out[i] = op over ranks 0..n-1, in that order, of
// src[rank][offset + i]. Every rank that reduces the same range gets the same bits. bf16 is
// combined in fp32 and rounded once; fp32 and fp64 in their own type.
#include <cuda_bf16.h>

#include "comm/ipc_reduce.hpp"
#include "core/cuda_check.hpp"

namespace hcp::ipc {
namespace {

template <class T>
struct Acc {
  using type = T;
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
};
template <class T>
__device__ typename Acc<T>::type widen(T v) {
  return v;
}
template <>
__device__ float widen<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <class T>
__device__ T narrow(typename Acc<T>::type v) {
  return v;
}
template <>
__device__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <class T, bool kSum>
__global__ void reduce_kernel(T* out, Sources src, int n, std::int64_t count, std::int64_t offset) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    auto acc = widen(static_cast<const T*>(src.p[0])[offset + i]);
    for (int r = 1; r < n; ++r) {
      const auto v = widen(static_cast<const T*>(src.p[r])[offset + i]);
      acc = kSum ? acc + v : (v > acc ? v : acc);
    }
    out[i] = narrow<T>(acc);
  }
}

template <class T>
void launch(void* out, const Sources& src, int n, std::int64_t count, std::int64_t offset, bool sum, cudaStream_t s) {
  const int threads = 256;
  const std::int64_t want = (count + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 4096 ? (want > 0 ? want : 1) : 4096);
  if (sum)
    reduce_kernel<T, true><<<blocks, threads, 0, s>>>(static_cast<T*>(out), src, n, count, offset);
  else
    reduce_kernel<T, false><<<blocks, threads, 0, s>>>(static_cast<T*>(out), src, n, count, offset);
  HCP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void reduce(void* out, const Sources& src, int n, std::int64_t count, std::int64_t offset, DType dt, bool sum,
            cudaStream_t s) {
  if (count == 0) return;
  switch (dt) {
    case DType::F32:
      return launch<float>(out, src, n, count, offset, sum, s);
    case DType::F64:
      return launch<double>(out, src, n, count, offset, sum, s);
    case DType::BF16:
      return launch<__nv_bfloat16>(out, src, n, count, offset, sum, s);
  }
}

}  // namespace hcp::ipc
