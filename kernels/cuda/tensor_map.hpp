// TMA tensor maps (Hopper): the grouped GEMM's operands and the fused attention backward's Q / dO.
#pragma once

#include <cstdint>

namespace hcp::kernels::cuda_impl {

// One CUtensorMap (128 bytes, 64-byte aligned), passed to kernels by value or in global memory.
struct alignas(64) TensorMap {
  unsigned char bytes[128];
};
// A 2-D bf16 tensor map of `rows` x `cols` (cols contiguous, row stride ld elements) at base, box
// [box_rows][box_cols], 128-byte swizzle, zeros beyond the extents. Throws hcp::Error if the driver
// rejects it (base not 16-byte aligned, ld · 2 not a multiple of 16, ...).
TensorMap make_map(const void* base, std::int64_t rows, std::int64_t cols, std::int64_t ld, unsigned box_rows,
                   unsigned box_cols);

}  // namespace hcp::kernels::cuda_impl
