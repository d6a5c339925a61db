#include "kernels/cuda/runtime.hpp"

#include <mutex>

#include "core/device.hpp"
#include "kernels/cuda/common.cuh"

namespace hcp::cuda {
namespace {
bool g_init = false;
int g_device = -1;
cublasHandle_t g_cublas = nullptr;
std::string g_name;

void* dev_alloc(std::size_t n) {
  void* p = nullptr;
  HCP_CUDA_CHECK(cudaMalloc(&p, n));
  return p;
}
void dev_free(void* p) { cudaFree(p); }
void dev_copy(void* dst, Space ds, const void* src, Space ss, std::size_t n) {
  if (n == 0) return;
  const cudaMemcpyKind k = ds == Space::Cuda ? (ss == Space::Cuda ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                             : (ss == Space::Cuda ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  HCP_CUDA_CHECK(cudaMemcpy(dst, src, n, k));
}
void dev_zero(void* p, std::size_t n) {
  if (n) HCP_CUDA_CHECK(cudaMemset(p, 0, n));
}
void* pinned_alloc(std::size_t n) {
  void* p = nullptr;
  HCP_CUDA_CHECK(cudaMallocHost(&p, n));
  return p;
}
void pinned_free(void* p) { cudaFreeHost(p); }
bool is_dev(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clear
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {  // n is left untouched on error
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(e);
  }
  return n > 0 ? "" : "no CUDA device";
}

void init(int local_rank) {
  static std::mutex m;
  std::lock_guard<std::mutex> lk(m);
  if (g_init) return;
  const int n = device_count();
  HCP_CHECK(n > 0, "no usable GPU: ", unavailable_reason());
  g_device = local_rank % n;
  HCP_CUDA_CHECK(cudaSetDevice(g_device));
  cudaDeviceProp prop{};
  HCP_CUDA_CHECK(cudaGetDeviceProperties(&prop, g_device));
  g_name = "cuda:" + std::to_string(g_device) + " " + prop.name;
  HCP_CUBLAS_CHECK(cublasCreate(&g_cublas));
  // fp32 GEMMs in true fp32 (no TF32), so CUDA results can be held to host tolerances.
  HCP_CUBLAS_CHECK(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));
  DeviceOps ops;
  ops.alloc = dev_alloc;
  ops.free = dev_free;
  ops.copy = dev_copy;
  ops.zero = dev_zero;
  ops.alloc_pinned = pinned_alloc;
  ops.free_pinned = pinned_free;
  ops.is_device_ptr = is_dev;
  ops.name = g_name;
  register_device_ops(ops);
  g_init = true;
}

bool initialized() { return g_init; }
std::string device_name() { return g_name; }
cublasHandle_t cublas() {
  HCP_CHECK(g_init, "CUDA kernels called before hcp::cuda::init()");
  return g_cublas;
}

}  // namespace hcp::cuda
