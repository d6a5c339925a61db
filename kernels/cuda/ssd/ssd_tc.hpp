// Mamba2 SSD chunk products on the tensor cores (kernels/cuda/ssd/ssd_tc.cu): bf16 replacements for the
// phases of the chunked SSD (kernels/cuda/ssd/chunked.hpp) that are matrix products.
#pragma once
#include <cuda_bf16.h>

#include <cstddef>
#include <functional>

#include "kernels/cuda/ssd/chunked.hpp"

namespace hcp::kernels::cuda_impl::ssd_tc {
// True when the tensor-core kernels cover these sizes (head_dim 64, chunk 128, d_state 64 or 128); the
// call's tensors must also be 16-byte aligned.
bool covers(const ssdc::Dims& d);
// What the phases keep between them in their own layout (not the element phases' Work): allocated
// through `alloc` (stream-ordered, alive until the caller's exec frees it after the work), by the phase
// that writes it.
struct Scratch {
  std::function<void*(std::size_t)> alloc;
  __nv_bfloat16* states = nullptr;   // Pass: chunk-start states, bf16 [B,nch,H,P,N] (k.w.states keeps the local ones)
  __nv_bfloat16* dstates = nullptr;  // DPass: end-state gradients, bf16 (q.dstates keeps the local ones)
  float* dots = nullptr;             // DPass: [B,nch,H,P·N/1024] partial sums of S_in · dS_end
  __nv_bfloat16* M = nullptr;        // Terms: [B,nch,G,Q,Q] Σ_h dec dt dy·x^T
};
// Runs phase `ph` (forward phases see null backward buffers). Only where covers() holds and every
// tensor of the call is 16-byte aligned, and then for every phase of the call: the phases hand over
// through `s` in their own layout, so a call runs all of its phases here or none.
void run(ssdc::Phase ph, const ssdc::BwdCtx<__nv_bfloat16, float>& q, const ssdc::Io<__nv_bfloat16, float>& io,
         Scratch& s);
}  // namespace hcp::kernels::cuda_impl::ssd_tc
