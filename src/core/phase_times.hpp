// Milliseconds per named phase, summed over calls. Host tensors: the wall time of each call. GPU
// tensors: the time between two CUDA events recorded on the default stream around the call, so a
// phase is charged its own device work however far the host runs ahead of it (kernels launched in
// one phase and finished in the next are not charged to the next). Device times are read when the
// totals are asked for (one wait for the last event).
#pragma once
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "core/device.hpp"

namespace hcp {

class PhaseTimes {
 public:
  PhaseTimes() = default;
  PhaseTimes(const PhaseTimes&) = delete;
  PhaseTimes& operator=(const PhaseTimes&) = delete;
  ~PhaseTimes() { release(); }

  template <class F>
  void time(const std::string& name, Space space, F&& f) {
    const DeviceOps* ops = space == Space::Cuda ? device_ops() : nullptr;
    if (ops && ops->event_mark) {
      void* a = ops->event_mark();
      f();
      pending_.push_back({name, a, ops->event_mark()});
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms_[name] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  // Every phase's total since the last reset (reads the pending device events).
  const std::map<std::string, double>& totals() const {
    const DeviceOps* ops = device_ops();
    for (const Pending& p : pending_) ms_[p.name] += ops->event_elapsed_ms(p.a, p.b);
    release();
    return ms_;
  }
  void reset() {
    release();
    ms_.clear();
  }

 private:
  struct Pending {
    std::string name;
    void *a, *b;
  };
  void release() const {
    const DeviceOps* ops = device_ops();
    for (const Pending& p : pending_) {
      ops->event_release(p.a);
      ops->event_release(p.b);
    }
    pending_.clear();
  }
  mutable std::vector<Pending> pending_;
  mutable std::map<std::string, double> ms_;
};

}  // namespace hcp
