// Admission: the bytes one rank may use, and the refusal (or warning) of a run whose memory model
// does not fit them, before anything is allocated.
#pragma once
#include <functional>
#include <limits>
#include <string>

#include "harness.hpp"
#include "memory_model.hpp"

namespace hcp::drivers {

inline double gib(double bytes) { return bytes / (1024.0 * 1024 * 1024); }

// The bytes one rank may use: the smallest of MemAvailable, the cgroup's memory limit less its usage
// (v2 memory.max / v1 memory.limit_in_bytes) and, for GPU ranks, the device's free memory (or
// run.memory_gib when given), divided among the ranks that share it (`sharing`). `source`
// names which one bound it.
struct MemoryLimit {
  double bytes = std::numeric_limits<double>::infinity();
  int sharing = 1;
  std::string source;
};
MemoryLimit memory_limit(const Deck& d, bool cuda, int ranks_per_node);
// The validate phase's device and limit: selects the GPU of run.device (a dry run with run.memory_gib
// needs none) and reads the limit of one rank of this run (--ranks N: N ranks sharing this node, or
// one GPU each).
MemoryLimit device_and_limit(const DriverContext& ctx);
// Refuses (run.memory_check = "refuse"), warns ("warn") or skips ("off") a run whose model exceeds
// the limit on any rank; the message names the part that does not fit and what would help. `cp` and
// `world` are the run's; `at_cp(c)` rebuilds the model at CP size c (to say whether more ranks help).
// True when it warned: the run goes on with sizes the model does not fit.
bool admit(const Deck& d, const MemoryModel& m, const MemoryLimit& lim, int cp,
           const std::function<MemoryModel(int)>& at_cp, bool root);
// The model by part, one line each, and one machine-readable line "MEMORY {json}" (--dry-run).
void print_memory(const MemoryModel& m, const MemoryLimit& lim, int cp, int world, const std::string& driver,
                  const std::function<MemoryModel(int)>& at_cp);

}  // namespace hcp::drivers
