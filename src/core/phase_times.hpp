// Milliseconds per named phase, summed over calls. Host tensors: the wall time of each call. GPU
// tensors: the time between two CUDA events recorded on the default stream around the call, so a
// phase is charged its own device work however far the host runs ahead of it (kernels launched in
// one phase and finished in the next are not charged to the next). Device times are read when the
// totals are asked for (one wait for the last event). The layers' phases, a CP attention pass's
// compute / communication-wait split and the drivers' per-iteration laps all use it.
// Each phase also keeps its tensor high-water: the most tensor bytes of its memory space alive at
// once during any of its calls (nested phases count toward the phases around them).
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/clock.hpp"
#include "core/device_ops.hpp"
#include "core/tensor.hpp"

namespace hcp {

class PhaseTimes {
 public:
  PhaseTimes() = default;
  PhaseTimes(const PhaseTimes&) = delete;
  PhaseTimes& operator=(const PhaseTimes&) = delete;
  ~PhaseTimes() {
    release();
    drop_lap_mark();
  }

  struct Peak {
    std::int64_t bytes = 0;  // tensor bytes alive at once, at most, during the phase
    int depth = 0;           // how many phases enclose it
  };
  template <class F>
  void time(const std::string& name, Space space, F&& f) {
    const std::int64_t outer = take_tensor_scope_peak(space);  // the enclosing phase's so far
    ++depth_;
    const DeviceOps* ops = space == Space::Cuda ? device_ops() : nullptr;
    if (ops && ops->event_mark) {
      void* a = ops->event_mark();
      f();
      pending_.push_back({name, a, ops->event_mark()});
    } else {
      const double t0 = now_seconds();
      f();
      ms_[name] += (now_seconds() - t0) * 1e3;
    }
    --depth_;
    const std::int64_t inner = take_tensor_scope_peak(space);
    Peak& pk = peaks_[name];
    pk.bytes = std::max(pk.bytes, inner);
    pk.depth = depth_;
    raise_tensor_scope_peak(space, std::max(outer, inner));
  }
  // Every phase's tensor high-water since the last reset.
  const std::map<std::string, Peak>& peaks() const { return peaks_; }
  // Laps, for a body that interleaves its phases: start_laps marks the start; lap(name) charges the
  // time since the previous mark to `name` ("" to none) and marks again. Host: wall time; GPU: CUDA
  // events on the default stream, as time() records.
  void start_laps(Space space) {
    drop_lap_mark();
    const DeviceOps* ops = space == Space::Cuda ? device_ops() : nullptr;
    lap_ops_ = ops && ops->event_mark ? ops : nullptr;
    if (lap_ops_)
      lap_a_ = lap_ops_->event_mark();
    else
      lap_t0_ = now_seconds();
  }
  void lap(const std::string& name) {
    if (lap_ops_) {
      void* b = lap_ops_->event_mark();
      if (name.empty()) {
        lap_ops_->event_release(lap_a_);
        lap_a_ = b;
        return;
      }
      pending_.push_back({name, lap_a_, b});
      lap_a_ = lap_ops_->event_mark();
      return;
    }
    const double t = now_seconds();
    if (!name.empty()) ms_[name] += (t - lap_t0_) * 1e3;
    lap_t0_ = t;
  }
  // A figure measured by other means (e.g. a layer's own phase totals), added to phase `name`.
  void add(const std::string& name, double ms) { ms_[name] += ms; }
  // Every phase's total since the last reset (reads the pending device events).
  const std::map<std::string, double>& totals() const {
    const DeviceOps* ops = device_ops();
    for (const Pending& p : pending_) ms_[p.name] += ops->event_elapsed_ms(p.a, p.b);
    release();
    return ms_;
  }
  void reset() {
    release();
    drop_lap_mark();
    ms_.clear();
    peaks_.clear();
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
  void drop_lap_mark() {
    if (lap_ops_ && lap_a_) lap_ops_->event_release(lap_a_);
    lap_a_ = nullptr;
    lap_ops_ = nullptr;
  }
  mutable std::vector<Pending> pending_;
  mutable std::map<std::string, double> ms_;
  std::map<std::string, Peak> peaks_;
  int depth_ = 0;
  const DeviceOps* lap_ops_ = nullptr;  // laps on the GPU: the ops, and the mark the next lap starts at
  void* lap_a_ = nullptr;
  double lap_t0_ = 0;
};

}  // namespace hcp
