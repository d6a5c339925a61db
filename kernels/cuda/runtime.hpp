// CUDA runtime of hybridcp: device selection, the device-memory hooks of core (Tensor on
// Space::Cuda), the cuBLAS handle. Built only when CUDA is found (HCP_HAVE_CUDA).
#pragma once
#include <string>

namespace hcp::cuda {

// Usable GPUs in this process (0 when there is no driver or device; never throws).
int device_count();
// Why there is no usable GPU ("" when there is one), e.g. "CUDA driver version is insufficient".
std::string unavailable_reason();
// Selects device local_rank % device_count(), registers the device-memory hooks and creates the
// cuBLAS handle. Throws (naming the reason) when no GPU is usable. Idempotent.
void init(int local_rank = 0);
bool initialized();
std::string device_name();

}  // namespace hcp::cuda
