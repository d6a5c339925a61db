// The study's clock: CUDA events on GPU ranks, MPI_Wtime on host ranks.
#include <mpi.h>

#include <cstdio>

#include "clock.hpp"
#ifdef HCP_HAVE_CUDA
#include "kernels/cuda/runtime.hpp"
#endif

namespace hcp::drivers {

// ---- Clock ----------------------------------------------------------------------------------------
Clock::Clock(Space space) : space_(space) {}
Clock::~Clock() {
#ifdef HCP_HAVE_CUDA
  for (auto& [n, m] : marks_) cuda::event_release(m);
  if (start_) cuda::event_release(start_);
#endif
}
void Clock::start() {
  host_.clear();
  extra_.clear();
#ifdef HCP_HAVE_CUDA
  for (auto& [n, m] : marks_) cuda::event_release(m);
  marks_.clear();
  if (space_ == Space::Cuda) {
    if (start_) cuda::event_release(start_);
    start_ = cuda::event_mark();
    return;
  }
#endif
  t_ = MPI_Wtime();
}
void Clock::lap(const std::string& phase) {
#ifdef HCP_HAVE_CUDA
  if (space_ == Space::Cuda) {
    marks_.emplace_back(phase, cuda::event_mark());
    return;
  }
#endif
  const double t = MPI_Wtime();
  host_.emplace_back(phase, (t - t_) * 1e3);
  t_ = t;
}
std::vector<std::pair<std::string, double>> Clock::read() {
#ifdef HCP_HAVE_CUDA
  if (space_ == Space::Cuda) {
    std::vector<std::pair<std::string, double>> out;
    void* prev = start_;
    for (auto& [n, m] : marks_) {
      out.emplace_back(n, cuda::event_elapsed_ms(prev, m));
      prev = m;
    }
    out.insert(out.end(), extra_.begin(), extra_.end());
    return out;
  }
#endif
  std::vector<std::pair<std::string, double>> out = host_;
  out.insert(out.end(), extra_.begin(), extra_.end());
  return out;
}

}  // namespace hcp::drivers
