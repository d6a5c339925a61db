// CUDA runtime of hybridcp: device selection, the device-memory hooks of core (Tensor on
// Space::Cuda), the cuBLAS handle. Built only when CUDA is found (HCP_HAVE_CUDA).
#pragma once
#include <cstddef>
#include <string>

namespace hcp::cuda {

// Usable GPUs in this process (0 when there is no driver or device; never throws).
int device_count();
// Why there is no usable GPU ("" when there is one), e.g. "CUDA driver version is insufficient".
std::string unavailable_reason();
// Selects device local_rank % device_count(), registers the device-memory hooks and creates the
// cuBLAS handle. Throws (naming the reason) when no GPU is usable. Idempotent.
void init(int local_rank = 0);
std::string device_name();
// "CUDA runtime 13.0, driver 13.0" (the driver part "none" without a driver).
std::string versions();
void synchronize();
// The device's stream-ordered pool, which holds every tensor and kernel workspace: its high-water
// mark of bytes in use since the last reset, and the bytes in use now.
std::size_t pool_high_water(bool reset);
std::size_t pool_used();
// Milliseconds between CUDA events recorded on the default stream before and after fn() (host
// launch gaps inside fn count; the final synchronisation does not).
double time_ms(void (*fn)(void*), void* arg);
template <class F>
double time_ms(F& f) {
  return time_ms([](void* a) { (*static_cast<F*>(a))(); }, &f);
}
// Time marks on the default stream (CUDA events), for phase timings that are the device's own:
// event_mark records a new one; event_elapsed_ms waits for b and returns the ms from a to b.
void* event_mark();
double event_elapsed_ms(void* a, void* b);
void event_release(void* e);
// Device memory in use (all processes), bytes; and free now.
std::size_t used_memory();
std::size_t free_memory();

}  // namespace hcp::cuda
