// Device reduction over the ranks' exported buffers (CUDA IPC communicator).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace hcp::ipc {

inline constexpr int kMaxRanks = 64;  // ranks of one IPC group (one node)
struct Sources {
  const void* p[kMaxRanks];
};
// out[i] = (sum or max) over r < n, in rank order, of src.p[r][offset + i], i < count (elements
// of dt), on stream s.
void reduce(void* out, const Sources& src, int n, std::int64_t count, std::int64_t offset, DType dt, bool sum,
            cudaStream_t s);

}  // namespace hcp::ipc
