// Mamba2 SSD chunk products on the tensor cores (kernels/cuda/ssd_tc.cu): bf16 replacements for the
// C·B^T, chunk-state and chunk-scan phases of the chunked SSD (kernels/cuda/ssd_chunked.hpp).
#pragma once
#include <cuda_bf16.h>

#include "kernels/cuda/ssd_chunked.hpp"

namespace hcp::kernels::cuda_impl::ssd_tc {
// True when the tensor-core kernels cover these sizes (head_dim 64, chunk 128, d_state 64 or 128).
bool covers(const ssdc::Dims& d);
// Runs phase `ph` into k.w (CB, states) or y (scan); false (nothing run) where covers() is false or an
// operand is not 16-byte aligned.
bool run(ssdc::Phase ph, const ssdc::Ctx<__nv_bfloat16, float>& k, __nv_bfloat16* y);
}  // namespace hcp::kernels::cuda_impl::ssd_tc
