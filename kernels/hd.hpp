// HCP_HD marks a function that the host and the CUDA kernels share: __host__ __device__ under nvcc,
// plain inline in host-only translation units. A rule written once with it runs unchanged on both
// sides (the host oracle and the GPU kernels cannot drift apart).
#pragma once

#ifdef __CUDACC__
#define HCP_HD __host__ __device__ __forceinline__
#else
#define HCP_HD inline
#endif
