// Pieces the attention CP strategy bodies (cp/attention_<name>.cpp) share. Private to src/cp.
#pragma once
#include <vector>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace hcp::cp {

inline Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype()); }
// The dtype of the log-sum-exp and of the merged outputs: fp64 for fp64 inputs, fp32 otherwise.
inline DType lse_dtype(const Tensor& q) { return q.dtype() == DType::F64 ? DType::F64 : DType::F32; }
// Appends g when it has at least one (query, key) pair.
inline void keep_segment(std::vector<kernels::AttnSegment>& segs, const kernels::AttnSegment& g) {
  if (g.q_len > 0 && g.kv_len > 0) segs.push_back(g);
}

}  // namespace hcp::cp
