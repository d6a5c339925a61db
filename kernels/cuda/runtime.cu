#include "kernels/cuda/runtime.hpp"

#include <mutex>
#include <type_traits>

#include "core/device_ops.hpp"
#include "kernels/cuda/common.cuh"

namespace hcp::cuda {
namespace {
bool g_init = false;
int g_device = -1;
cublasHandle_t g_cublas = nullptr;
std::string g_name;

// The current device's default memory pool.
cudaMemPool_t default_pool() {
  cudaMemPool_t pool;
  int dev = 0;
  HCP_CUDA_CHECK(cudaGetDevice(&dev));
  HCP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  return pool;
}
// Tensors live in the device's default memory pool, stream-ordered on the default stream: an
// allocation or a free queues behind the work already issued instead of synchronising the device (as
// cudaMalloc/cudaFree do), and freed blocks stay cached for the next step (release threshold: never,
// set in init). When the pool cannot grow, its cached blocks are handed back once and the
// allocation is tried again.
void* dev_alloc(std::size_t n) {
  void* p = nullptr;
  if (cudaMallocAsync(&p, n, 0) == cudaSuccess) return p;
  cudaGetLastError();
  HCP_CUDA_CHECK(cudaDeviceSynchronize());
  HCP_CUDA_CHECK(cudaMemPoolTrimTo(default_pool(), 0));
  HCP_CUDA_CHECK(cudaMallocAsync(&p, n, 0));
  return p;
}
void dev_free(void* p) { cudaFreeAsync(p, 0); }
// Device-to-device copies and zero fills are queued on the default stream; copies from or to host
// memory wait for the device, as the host reads or reuses that memory next.
void dev_copy(void* dst, Space ds, const void* src, Space ss, std::size_t n) {
  if (n == 0) return;
  if (ds == Space::Cuda && ss == Space::Cuda) {
    HCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, 0));
    return;
  }
  const cudaMemcpyKind k =
      ds == Space::Cuda ? cudaMemcpyHostToDevice : (ss == Space::Cuda ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  HCP_CUDA_CHECK(cudaMemcpy(dst, src, n, k));
}
void dev_zero(void* p, std::size_t n) {
  if (n) HCP_CUDA_CHECK(cudaMemsetAsync(p, 0, n, 0));
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
struct StridedArgs {
  std::int64_t shape[8], ds[8], ss[8];
  int ndim;
};
template <class W>
__global__ void strided_k(W* dst, const W* src, StridedArgs a, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  std::int64_t rem = i, od = 0, os = 0;
  for (int k = a.ndim - 1; k >= 0; --k) {
    const std::int64_t idx = rem % a.shape[k];
    rem /= a.shape[k];
    od += idx * a.ds[k];
    os += idx * a.ss[k];
  }
  dst[od] = src[os];
}
void dev_copy_strided(void* dst, const std::int64_t* ds, const void* src, const std::int64_t* ss,
                      const std::int64_t* shape, int ndim, std::size_t elem) {
  StridedArgs a{};
  a.ndim = ndim;
  std::int64_t n = 1;
  for (int k = 0; k < ndim; ++k) {
    a.shape[k] = shape[k];
    a.ds[k] = ds[k];
    a.ss[k] = ss[k];
    n *= shape[k];
  }
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  switch (elem) {
    case 2:
      strided_k<unsigned short>
          <<<blocks, 256>>>(static_cast<unsigned short*>(dst), static_cast<const unsigned short*>(src), a, n);
      break;
    case 4:
      strided_k<unsigned int>
          <<<blocks, 256>>>(static_cast<unsigned int*>(dst), static_cast<const unsigned int*>(src), a, n);
      break;
    default:
      strided_k<unsigned long long>
          <<<blocks, 256>>>(static_cast<unsigned long long*>(dst), static_cast<const unsigned long long*>(src), a, n);
      break;
  }
  check_launch("strided copy");
}
// One thread per 2-byte word of each row.
__global__ void rows_k(unsigned short* dst, const unsigned short* src, const std::int64_t* dr, const std::int64_t* sr,
                       std::int64_t n, std::int64_t words) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * words) return;
  const std::int64_t r = i / words, w = i % words;
  dst[dr[r] * words + w] = src[sr[r] * words + w];
}
void dev_copy_rows(void* dst, const void* src, const std::int64_t* drows, const std::int64_t* srows, std::int64_t n,
                   std::size_t row_bytes) {
  if (n == 0 || row_bytes == 0) return;
  HCP_CHECK(row_bytes % 2 == 0, "device row copy: rows of ", row_bytes, " bytes are not whole 2-byte words");
  // Stream-ordered index buffers: the copy is ordered with the work around it and does not stall the device.
  const DeviceIndex d(drows, static_cast<std::size_t>(n)), s(srows, static_cast<std::size_t>(n));
  const std::int64_t words = static_cast<std::int64_t>(row_bytes / 2);
  rows_k<<<static_cast<unsigned>((n * words + 255) / 256), 256>>>(
      static_cast<unsigned short*>(dst), static_cast<const unsigned short*>(src), d.p, s.p, n, words);
  check_launch("row copy");
}
// Element-wise dtype conversion with the host's rounding (Tensor::set: double -> float -> bf16).
template <class D, class S>
__global__ void convert_k(D* dst, const S* src, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  double v;
  if constexpr (std::is_same_v<S, __nv_bfloat16>)
    v = static_cast<double>(__bfloat162float(src[i]));
  else
    v = static_cast<double>(src[i]);
  if constexpr (std::is_same_v<D, __nv_bfloat16>)
    dst[i] = __float2bfloat16(static_cast<float>(v));
  else
    dst[i] = static_cast<D>(v);
}
template <class D>
void convert_from(D* dst, const void* src, DType sdt, std::int64_t n) {
  const unsigned blocks = blocks_for(n, 256);
  switch (sdt) {
    case DType::F64:
      convert_k<<<blocks, 256>>>(dst, static_cast<const double*>(src), n);
      break;
    case DType::F32:
      convert_k<<<blocks, 256>>>(dst, static_cast<const float*>(src), n);
      break;
    case DType::BF16:
      convert_k<<<blocks, 256>>>(dst, static_cast<const __nv_bfloat16*>(src), n);
      break;
  }
}
void dev_convert(void* dst, DType ddt, const void* src, DType sdt, std::int64_t n) {
  if (n <= 0) return;
  switch (ddt) {
    case DType::F64:
      convert_from(static_cast<double*>(dst), src, sdt, n);
      break;
    case DType::F32:
      convert_from(static_cast<float*>(dst), src, sdt, n);
      break;
    case DType::BF16:
      convert_from(static_cast<__nv_bfloat16*>(dst), src, sdt, n);
      break;
  }
  check_launch("dtype conversion");
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
  // Tensors and scratch from cudaMallocAsync stay cached in the default pool across synchronisations
  // (the pool would otherwise hand them back to the driver at every synchronise and map them again).
  std::uint64_t keep = UINT64_MAX;
  HCP_CUDA_CHECK(cudaMemPoolSetAttribute(default_pool(), cudaMemPoolAttrReleaseThreshold, &keep));
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
  ops.copy_strided = dev_copy_strided;
  ops.copy_rows = dev_copy_rows;
  ops.convert = dev_convert;
  ops.event_mark = event_mark;
  ops.event_elapsed_ms = event_elapsed_ms;
  ops.event_release = event_release;
  ops.name = g_name;
  register_device_ops(ops);
  g_init = true;
}

std::string device_name() { return g_name; }
std::string versions() {
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  const bool has_driver = cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0;
  cudaGetLastError();
  const auto v = [](int x) { return std::to_string(x / 1000) + "." + std::to_string(x % 1000 / 10); };
  return "CUDA runtime " + v(rt) + ", driver " + (has_driver ? v(drv) : std::string("none"));
}
void synchronize() { HCP_CUDA_CHECK(cudaDeviceSynchronize()); }
double time_ms(void (*fn)(void*), void* arg) {
  cudaEvent_t a, b;
  HCP_CUDA_CHECK(cudaEventCreate(&a));
  HCP_CUDA_CHECK(cudaEventCreate(&b));
  HCP_CUDA_CHECK(cudaEventRecord(a, 0));
  fn(arg);
  HCP_CUDA_CHECK(cudaEventRecord(b, 0));
  HCP_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  HCP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(ms);
}

void* event_mark() {
  cudaEvent_t e;
  HCP_CUDA_CHECK(cudaEventCreate(&e));
  HCP_CUDA_CHECK(cudaEventRecord(e, 0));
  return e;
}
double event_elapsed_ms(void* a, void* b) {
  HCP_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(b)));
  float ms = 0;
  HCP_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)));
  return static_cast<double>(ms);
}
void event_release(void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }

std::size_t pool_high_water(bool reset) {
  const cudaMemPool_t pool = default_pool();
  std::uint64_t v = 0;
  HCP_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v));
  if (reset) {
    std::uint64_t zero = 0;  // resets the mark to the bytes in use now
    HCP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  }
  return static_cast<std::size_t>(v);
}
std::size_t pool_used() {
  std::uint64_t v = 0;
  HCP_CUDA_CHECK(cudaMemPoolGetAttribute(default_pool(), cudaMemPoolAttrUsedMemCurrent, &v));
  return static_cast<std::size_t>(v);
}
std::size_t used_memory() {
  std::size_t free_b = 0, total_b = 0;
  HCP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}
std::size_t free_memory() {
  std::size_t free_b = 0, total_b = 0;
  HCP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}
cublasHandle_t cublas() {
  HCP_CHECK(g_init, "CUDA kernels called before hcp::cuda::init()");
  return g_cublas;
}

}  // namespace hcp::cuda
