// The host's monotonic clock in seconds from an arbitrary origin: the one time source of the
// communicators' records, waits and deadlines, and of the phase times on host ranks
// (core/phase_times.hpp).
#pragma once
#include <chrono>

namespace hcp {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace hcp
