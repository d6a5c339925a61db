// Check macros for CUDA, cuBLAS and NCCL (included only by CUDA translation units).
#pragma once
#include "core/error.hpp"

#define HCP_CUDA_CHECK(call)                                                                         \
  do {                                                                                               \
    cudaError_t hcp_cu_rc_ = (call);                                                                 \
    if (hcp_cu_rc_ != cudaSuccess)                                                                   \
      ::hcp::detail::throw_error(                                                                    \
          __FILE__, __LINE__,                                                                        \
          ::hcp::detail::concat("CUDA call failed: ", #call, ": ", cudaGetErrorString(hcp_cu_rc_))); \
  } while (0)

#define HCP_CUBLAS_CHECK(call)                                                                               \
  do {                                                                                                       \
    cublasStatus_t hcp_cb_rc_ = (call);                                                                      \
    if (hcp_cb_rc_ != CUBLAS_STATUS_SUCCESS)                                                                 \
      ::hcp::detail::throw_error(                                                                            \
          __FILE__, __LINE__,                                                                                \
          ::hcp::detail::concat("cuBLAS call failed (status ", static_cast<int>(hcp_cb_rc_), "): ", #call)); \
  } while (0)

#define HCP_NCCL_CHECK(call)                                                                         \
  do {                                                                                               \
    ncclResult_t hcp_nc_rc_ = (call);                                                                \
    if (hcp_nc_rc_ != ncclSuccess)                                                                   \
      ::hcp::detail::throw_error(                                                                    \
          __FILE__, __LINE__,                                                                        \
          ::hcp::detail::concat("NCCL call failed: ", #call, ": ", ncclGetErrorString(hcp_nc_rc_))); \
  } while (0)
