// Device-memory hooks: the core layer knows no CUDA. A device backend (kernels/cuda) registers
// these once at start-up (hcp::cuda::init); until then, CUDA tensors are an error that says so.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.hpp"

namespace hcp {

struct DeviceOps {
  void* (*alloc)(std::size_t bytes) = nullptr;  // device memory (throws on failure)
  void (*free)(void* p) = nullptr;
  // dst <- src, n bytes; either side may be host or device memory (synchronous).
  void (*copy)(void* dst, Space dst_space, const void* src, Space src_space, std::size_t n) = nullptr;
  void (*zero)(void* p, std::size_t n) = nullptr;
  void* (*alloc_pinned)(std::size_t bytes) = nullptr;  // page-locked host memory for staging
  void (*free_pinned)(void* p) = nullptr;
  bool (*is_device_ptr)(const void* p) = nullptr;
  // Device to device, elements of `elem` bytes, any strides (in elements), ndim <= 8.
  void (*copy_strided)(void* dst, const std::int64_t* dst_strides, const void* src, const std::int64_t* src_strides,
                       const std::int64_t* shape, int ndim, std::size_t elem) = nullptr;
  // Device rows: dst row dst_rows[i] <- src row src_rows[i] (index arrays on the host).
  void (*copy_rows)(void* dst, const void* src, const std::int64_t* dst_rows, const std::int64_t* src_rows,
                    std::int64_t n, std::size_t row_bytes) = nullptr;
  // Device to device, n contiguous elements converted from src_dtype to dst_dtype with the host's
  // rounding (a value goes through double; to bf16 through float as well).
  void (*convert)(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t n) = nullptr;
  // A new event recorded on the default stream; the ms from a to b (waits for b); releasing one.
  void* (*event_mark)() = nullptr;
  double (*event_elapsed_ms)(void* a, void* b) = nullptr;
  void (*event_release)(void* e) = nullptr;
  std::string name;  // e.g. "cuda:0 NVIDIA H200"
};

void register_device_ops(const DeviceOps& ops);
// nullptr when no device backend has been initialised in this process.
const DeviceOps* device_ops();

}  // namespace hcp
