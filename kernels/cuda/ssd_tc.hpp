// Mamba2 SSD chunk products on the tensor cores (kernels/cuda/ssd_tc.cu): bf16 replacements for the
// phases of the chunked SSD (kernels/cuda/ssd_chunked.hpp) that are matrix products.
#pragma once
#include <cuda_bf16.h>

#include <cstddef>

#include "kernels/cuda/ssd_chunked.hpp"

namespace hcp::kernels::cuda_impl::ssd_tc {
// True when the tensor-core kernels cover these sizes (head_dim 64, chunk 128, d_state 64 or 128).
bool covers(const ssdc::Dims& d);
// Device scratch phase `ph` needs (0: none), to pass to run().
std::size_t scratch_bytes(ssdc::Phase ph, const ssdc::Dims& d);
// Runs phase `ph` (forward phases see null backward buffers); false (nothing run) where covers() is
// false or an operand is not 16-byte aligned. `scratch`: scratch_bytes(ph, d) bytes, 16-byte aligned,
// alive until the phase's kernels have run (stream order).
bool run(ssdc::Phase ph, const ssdc::BwdCtx<__nv_bfloat16, float>& q, const ssdc::Io<__nv_bfloat16, float>& io,
         void* scratch);
}  // namespace hcp::kernels::cuda_impl::ssd_tc
