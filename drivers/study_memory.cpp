// Memory of a study's cases per rank: tensor storage allocated in the timed step beyond what was
// alive before it, what was alive, the host RSS high-water and, on GPU ranks, the device's used
// memory and the high-water of its stream-ordered pool (every tensor and kernel workspace: the figure
// PyTorch reports as max_memory_allocated); /memory/<strategy>/ and one line per case.
#include <sys/resource.h>

#include <cstdio>

#include "study.hpp"
#ifdef HCP_HAVE_CUDA
#include "kernels/cuda/runtime.hpp"
#endif

namespace hcp::drivers {

double Study::memory_start() {
  const double live0 = static_cast<double>(tensor_bytes_live(space));
  reset_tensor_peak(space);
#ifdef HCP_HAVE_CUDA
  if (space == Space::Cuda) (void)cuda::pool_high_water(true);
#endif
  return live0;
}

void Study::memory_stop(double live0) {
  mem_ = Memory{};
  mem_.live = live0;
  mem_.work = static_cast<double>(tensor_bytes_peak(space)) - live0;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  mem_.rss_peak = static_cast<double>(ru.ru_maxrss) * 1024.0;
#ifdef HCP_HAVE_CUDA
  if (space == Space::Cuda) {
    mem_.device_used = static_cast<double>(cuda::used_memory());
    mem_.pool_peak = static_cast<double>(cuda::pool_high_water(false));
  }
#endif
}

namespace {
// The innermost phase holding the high-water of `phases` ("" when none was timed).
std::string high_water_phase(const std::map<std::string, PhaseTimes::Peak>& phases) {
  const std::pair<const std::string, PhaseTimes::Peak>* top = nullptr;
  for (const auto& e : phases)
    if (!top || e.second.bytes > top->second.bytes ||
        (e.second.bytes == top->second.bytes && e.second.depth > top->second.depth))
      top = &e;
  return top ? top->first : std::string();
}
}  // namespace

void Study::phase_memory(const std::map<std::string, PhaseTimes::Peak>& peaks) {
  mem_.phases = peaks;
  for (auto& [name, pk] : mem_.phases) pk.bytes -= static_cast<std::int64_t>(mem_.live);
  // Every rank writes the same phases: the union over the group, zero where a rank ran none of a
  // phase (a rank without whole documents runs no whole-document layer).
  std::vector<std::string> mine;
  for (const auto& [name, pk] : mem_.phases) mine.push_back(name);
  for (const std::string& name : union_over(comm, mine)) mem_.phases.try_emplace(name);
}

void Study::write_parameter_memory(double elements, double expert_elements, int ep) {
  const double es = static_cast<double>(dtype_size(dt));
  if (root())
    std::printf("# parameters per rank (ep %d): %.3f MiB, of which routed experts %.3f MiB\n", ep,
                elements * es / 1048576.0, expert_elements * es / 1048576.0);
  if (!writer_) return;
  writer_->per_rank("/memory/parameters/bytes", elements * es, "bytes of parameters this rank holds");
  writer_->per_rank("/memory/parameters/expert_bytes", expert_elements * es,
                    "bytes of routed-expert weights this rank holds (1/ep of them)");
}

void Study::write_memory(const std::string& strategy) {
  const auto mib = [&](double v) { return comm.all_reduce_scalar(v, ReduceOp::Max) / 1048576.0; };
  const double work = mib(mem_.work), live = mib(mem_.live), rss = mib(mem_.rss_peak);
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "# memory per rank of %s (MiB, max over ranks): tensors allocated in the step %.2f, alive before it %.2f, "
      "host RSS high-water %.1f",
      strategy.c_str(), work, live, rss);
  std::string line = buf;
  double est = 0;
  if (memory_) {
    // The model's tensors of this rank against its measured high-water (alive before the step and
    // allocated in it): the extremes of the ratio over the ranks. Rank 0 also keeps the cp=1
    // reference's results beside every case.
    const MemoryModel mm = memory_(deck, cp, strategy);
    est = static_cast<double>(root() ? mm.sum(mm.total(Holder::Rank0Kept), mm.every_rank()) : mm.every_rank());
    const double measured = mem_.live + mem_.work, ratio = measured > 0 ? est / measured : 0;
    const double lo = -comm.all_reduce_scalar(-ratio, ReduceOp::Max), hi = comm.all_reduce_scalar(ratio, ReduceOp::Max);
    std::snprintf(buf, sizeof buf, ", model %.2f (model / measured over ranks %.3f..%.3f)", est / 1048576.0, lo, hi);
    line += buf;
  }
  const std::string where = high_water_phase(mem_.phases);
  if (!where.empty()) line += ", high-water in " + where + " (rank 0)";
  if (space == Space::Cuda) {
    const double used = mib(mem_.device_used), pool = mib(mem_.pool_peak);
    std::snprintf(buf, sizeof buf, ", device used %.1f, device pool high-water %.2f", used, pool);
    line += buf;
  }
  mem_lines_.push_back(line);
  if (!writer_) return;
  const std::string m = "/memory/" + strategy + "/";
  writer_->per_rank(m + "step_tensor_bytes", mem_.work,
                    "bytes of tensors allocated beyond those alive before the timed loop (high-water)");
  writer_->per_rank(m + "live_tensor_bytes", mem_.live, "bytes of tensors alive before the timed loop");
  for (const auto& [name, pk] : mem_.phases)
    writer_->per_rank(m + "phase_peak_bytes/" + name, static_cast<double>(pk.bytes),
                      "bytes of tensors alive at once during the phase, at most, beyond those alive before the "
                      "timed loop");
  if (!where.empty()) writer_->attribute("/memory/" + strategy, "high_water_phase", where);
  writer_->per_rank(m + "host_rss_peak_bytes", mem_.rss_peak, "bytes (process high-water since start)");
  if (memory_)
    writer_->per_rank(m + "model_bytes", est,
                      "bytes this rank holds in the case by the memory model (memory_model.hpp; rank 0 with the "
                      "kept cp=1 reference results)");
  if (space == Space::Cuda) {
    writer_->per_rank(m + "device_used_bytes", mem_.device_used, "bytes (cudaMemGetInfo: the whole GPU)");
    writer_->per_rank(m + "device_pool_peak_bytes", mem_.pool_peak,
                      "bytes (high-water of the stream-ordered pool: tensors and kernel workspaces)");
  }
}

}  // namespace hcp::drivers
