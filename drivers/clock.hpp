// The study's clock: per-phase milliseconds of one iteration, CUDA events on GPU ranks and MPI_Wtime
// on host ranks.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/device.hpp"

namespace hcp::drivers {

// Per-phase milliseconds of one iteration: lap(name) ends the phase begun at the previous lap (or at
// the start). GPU ranks time with CUDA events on the default stream, host ranks with MPI_Wtime.
class Clock {
 public:
  explicit Clock(Space space);
  ~Clock();
  Clock(const Clock&) = delete;
  Clock& operator=(const Clock&) = delete;
  void start();
  void lap(const std::string& phase);
  // A figure the driver measured itself this iteration (e.g. a layer's own compute / wait split).
  void add(const std::string& name, double ms) { extra_.emplace_back(name, ms); }
  std::vector<std::pair<std::string, double>> read();  // the laps of this iteration, then the added figures

 private:
  Space space_;
  double t_ = 0;
  std::vector<std::pair<std::string, double>> host_, extra_;
  std::vector<std::pair<std::string, void*>> marks_;
  void* start_ = nullptr;
};

// Per-repeat samples of the timed iterations: phase -> ms; "ring_wait" is the time blocked in
// ring_wait per iteration (for the overlap measurement).
using Samples = std::map<std::string, std::vector<double>>;

}  // namespace hcp::drivers
