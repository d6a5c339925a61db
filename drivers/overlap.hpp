// How much of the ring communication (p2p attention: K/V blocks, and in the backward dK/dV, travelling
// while a block computes) is hidden behind compute, measured on the ranks that ran it.
//   exposed  = time a rank blocks in ring_wait during one step (the communicator's counter, per step);
//   isolated = the same number of ring exchanges of the same mean size run with nothing to hide behind
//              (each posted and waited at once), right after the timed steps, on the same buffers' space;
//   overlap  = 1 - exposed / isolated, clamped to [0, 1] (1: fully hidden, 0: nothing hidden).
// Strategies without ring exchanges (all-gather, all-to-all: blocking collectives) report none.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "common.hpp"
#include "core/clock.hpp"
#include "core/tensor.hpp"

namespace hcp::drivers {

inline double ring_wait_seconds(const Communicator& c) {
  const auto it = c.counters().find("ring_wait");
  return it == c.counters().end() ? 0.0 : it->second.seconds;
}

struct RingTraffic {
  std::int64_t calls = 0, bytes = 0;  // ring_post calls and bytes sent, in the counters' window
};
inline RingTraffic ring_traffic(const Communicator& c) {
  const auto it = c.counters().find("ring_post");
  if (it == c.counters().end()) return {};
  return {it->second.calls, it->second.bytes_sent};
}

// Per-repeat milliseconds of `calls` ring exchanges of `bytes` each (send to rank+1, receive from
// rank-1), posted and waited one at a time; one untimed warm-up. Collective over `c`.
inline std::vector<double> isolated_ring_ms(Communicator& c, std::int64_t calls, std::int64_t bytes, Space space,
                                            int repeats) {
  const std::int64_t n = std::max<std::int64_t>((bytes + 1) / 2, 1);  // bf16 elements
  Tensor send = Tensor::zeros({n}, DType::BF16, space), recv = Tensor::zeros({n}, DType::BF16, space);
  const int r = c.rank(), p = c.size();
  constexpr int kTag = 7301;
  std::vector<double> ms;
  for (int it = -1; it < repeats; ++it) {
    c.barrier();
    const double t0 = now_seconds();
    for (std::int64_t i = 0; i < calls; ++i) {
      RingRequest rq = c.ring_post(send.raw(), recv.raw(), n, DType::BF16, (r + 1) % p, (r - 1 + p) % p, kTag);
      c.ring_wait(rq);
    }
    if (it >= 0) ms.push_back((now_seconds() - t0) * 1e3);
  }
  return ms;
}

// 1 - exposed / isolated in [0, 1]; NaN when the exposed ring time exceeds the isolated one (the
// wait then measures something besides the transfers, e.g. ranks sharing cores: no fraction of the
// ring is known to be hidden, and a clamped 0 would claim it).
inline double overlap_fraction(double exposed_ms, double isolated_ms) {
  if (isolated_ms <= 0 || exposed_ms > isolated_ms) return std::numeric_limits<double>::quiet_NaN();
  return std::clamp(1.0 - exposed_ms / isolated_ms, 0.0, 1.0);
}

struct Overlap {
  bool ring = false;                            // the strategy posted ring exchanges
  std::vector<double> exposed_ms, isolated_ms;  // per timed step / per replay
  double fraction = 0;                          // from the slowest rank's medians
};
// Call right after the timed steps, while the counters cover exactly `repeats` steps, with the
// per-step exposed ring time. Collective over `c` (every rank replays the largest per-step traffic,
// so neighbours' message sizes match). The replay adds to the counters: read them before.
inline Overlap measure_overlap(Communicator& c, std::vector<double> exposed_ms, int repeats, Space space) {
  Overlap o;
  o.exposed_ms = std::move(exposed_ms);
  if (c.size() < 2) return o;  // one rank: its ring steps are local copies, nothing to overlap
  const RingTraffic t = ring_traffic(c);
  const double calls = c.all_reduce_scalar(static_cast<double>(t.calls) / repeats, ReduceOp::Max);
  if (calls <= 0) return o;
  const double bytes = c.all_reduce_scalar(t.calls > 0 ? static_cast<double>(t.bytes) / t.calls : 0.0, ReduceOp::Max);
  o.ring = true;
  o.isolated_ms = isolated_ring_ms(c, static_cast<std::int64_t>(calls + 0.5), static_cast<std::int64_t>(bytes + 0.5),
                                   space, repeats);
  const double e = c.all_reduce_scalar(median(o.exposed_ms), ReduceOp::Max);
  const double i = c.all_reduce_scalar(median(o.isolated_ms), ReduceOp::Max);
  o.fraction = overlap_fraction(e, i);
  return o;
}

}  // namespace hcp::drivers
