// The kernel API's one routing rule: a call whose tensor `t` lives on the GPU runs the CUDA body
// (kernels/cuda), any other the host body (kernels/host); both take the same arguments. The API
// checks the shapes first, and the bodies rely on those checks.
#pragma once
#include "core/tensor.hpp"
#include "kernels/host/host_kernels.hpp"

#ifdef HCP_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.hpp"
#define HCP_ROUTE(t, op, ...)                                                     \
  ((t).space() == ::hcp::Space::Cuda ? ::hcp::kernels::cuda_impl::op(__VA_ARGS__) \
                                     : ::hcp::kernels::host::op(__VA_ARGS__))
#else
#define HCP_ROUTE(t, op, ...) (::hcp::kernels::host::op(__VA_ARGS__))
#endif
