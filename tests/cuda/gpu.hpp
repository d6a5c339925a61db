// GPU test helpers: initialise CUDA on this rank's GPU (by node-local rank, as the drivers do) or
// skip the test.
#pragma once
#include <gtest/gtest.h>

#include "comm/process_grid.hpp"
#include "kernels/cuda/runtime.hpp"

namespace hcp::test {
inline bool gpu() {
  if (cuda::device_count() == 0) return false;
  cuda::init(node_local_rank());
  return true;
}
}  // namespace hcp::test

#define REQUIRE_GPU() \
  if (!::hcp::test::gpu()) GTEST_SKIP() << "no usable GPU (" << ::hcp::cuda::unavailable_reason() << ")"
