// Tensor-core flash attention (bf16, head_dim 64/128): the fast path of attention_fwd/bwd on CUDA
// tensors (attention.cu routes to it when `supported`). Kernels and algorithm: attention_tc.cu.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels::cuda_impl::attn_tc {
struct Dims {
  const std::vector<AttnSegment>* segments;
  int H, Hkv, D;
  std::int64_t tq, tkv;
  float scale;
  bool causal;
};
struct Fwd {
  __nv_bfloat16* o;
  float* lse;
  const __nv_bfloat16 *q, *k, *v;
  Dims dims;
};
struct Bwd {
  __nv_bfloat16 *dq, *dk, *dv;  // dq rows outside every segment are left untouched
  const __nv_bfloat16 *q, *k, *v, *o;
  const float* lse;
  const __nv_bfloat16* dout;
  Dims dims;
  AttnBwdKernel kernel = AttnBwdKernel::Auto;
};
bool supported(DType dtype, std::int64_t head_dim, std::int64_t heads, std::int64_t kv_heads);
// Whether these operands can take the tensor-core path: every tensor 16-byte aligned (cp.async and
// TMA rows) and the token counts below 2^31 (the kernels' int32 row coordinates). Otherwise the
// general kernels run.
bool operands_ok(std::initializer_list<const void*> tensors, std::int64_t tq, std::int64_t tkv);
void fwd(const Fwd& a);
void bwd(const Bwd& a);
}  // namespace hcp::kernels::cuda_impl::attn_tc
