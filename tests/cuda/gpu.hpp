// GPU test helpers: initialise CUDA on this rank's GPU (by local rank) or skip the test.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>

#include "kernels/cuda/runtime.hpp"

namespace hcp::test {
inline bool gpu() {
  if (cuda::device_count() == 0) return false;
  int local = 0;
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) local = std::atoi(s);
  cuda::init(local);
  return true;
}
}  // namespace hcp::test

#define REQUIRE_GPU() \
  if (!::hcp::test::gpu()) GTEST_SKIP() << "no usable GPU (" << ::hcp::cuda::unavailable_reason() << ")"
