// Mamba2 SSD chunk products on the tensor cores (kernels/cuda/ssd_tc.cu): bf16 replacements for the
// phases of the chunked SSD (kernels/cuda/ssd_chunked.hpp) that are matrix products.
#pragma once
#include <cuda_bf16.h>

#include "kernels/cuda/ssd_chunked.hpp"

namespace hcp::kernels::cuda_impl::ssd_tc {
// True when the tensor-core kernels cover these sizes (head_dim 64, chunk 128, d_state 64 or 128).
bool covers(const ssdc::Dims& d);
// Runs phase `ph` (forward phases see null backward buffers); false (nothing run) where covers() is
// false or an operand is not 16-byte aligned.
bool run(ssdc::Phase ph, const ssdc::BwdCtx<__nv_bfloat16, float>& q, const ssdc::Io<__nv_bfloat16, float>& io);
}  // namespace hcp::kernels::cuda_impl::ssd_tc
