// Admission of a run from its memory model (memory_model.hpp): the bytes a rank may use (MemAvailable,
// the cgroup's headroom, GPU free memory, or run.memory_gib), the refusal that names the part that
// does not fit and what would help (the --dry-run report: memory_report.cpp).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/process_grid.hpp"
#include "device.hpp"
#include "memory_admission.hpp"
#ifdef HCP_HAVE_CUDA
#include "kernels/cuda/runtime.hpp"
#endif

namespace hcp::drivers {

namespace {
std::string gib_str(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GiB", gib(b));
  return buf;
}

double meminfo_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (in >> key >> kb) {
    if (key == "MemAvailable:") return kb * 1024.0;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::numeric_limits<double>::infinity();
}

double read_number(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string v;
  if (!(in >> v) || v == "max") return std::numeric_limits<double>::infinity();
  try {
    return std::stod(v);
  } catch (const std::exception&) {
    return std::numeric_limits<double>::infinity();
  }
}

// The headroom under this process's cgroup limits: limit - usage of its memory cgroup and of each
// ancestor, v2 ("0::/path": memory.max, memory.current) and v1 ("N:...memory...:/path":
// memory.limit_in_bytes, memory.usage_in_bytes). Infinity when unlimited.
double cgroup_headroom() {
  double best = std::numeric_limits<double>::infinity();
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const bool v2 = controllers.empty();
    if (!v2 && ("," + controllers + ",").find(",memory,") == std::string::npos) continue;
    const std::filesystem::path root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    for (std::filesystem::path p(line.substr(c2 + 1));; p = p.parent_path()) {
      const std::filesystem::path dir = root / p.relative_path();
      const double max = read_number(dir / (v2 ? "memory.max" : "memory.limit_in_bytes")),
                   cur = read_number(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"));
      if (std::isfinite(max) && max < 1e18) best = std::min(best, max - (std::isfinite(cur) ? cur : 0));
      if (p == p.root_path() || p.empty()) break;
    }
  }
  return best;
}
}  // namespace

MemoryLimit memory_limit(const Deck& d, bool cuda, int ranks_per_node) {
  MemoryLimit l;
  l.sharing = std::max(ranks_per_node, 1);
  const double given = d.get_float("run.memory_gib");
  if (given > 0) {
    l.bytes = given * 1024.0 * 1024 * 1024;
    l.source = "run.memory_gib";
    l.sharing = 1;
    return l;
  }
  if (cuda) {
#ifdef HCP_HAVE_CUDA
    if (cuda::device_count() > 0) {
      const int dev = cuda::device_count();
      l.sharing = std::max(1, (l.sharing + dev - 1) / dev);
      l.bytes = static_cast<double>(cuda::free_memory()) / l.sharing;
      l.source = "GPU free memory";
      return l;
    }
#endif
    l.source = "no GPU here and no run.memory_gib";
    return l;
  }
  const double avail = meminfo_available(), cg = cgroup_headroom();
  l.bytes = std::min(avail, cg) / l.sharing;
  l.source = cg < avail ? "cgroup memory limit" : "MemAvailable";
  return l;
}

MemoryLimit device_and_limit(const DriverContext& ctx) {
  const Deck& d = ctx.deck;
  const bool cuda = space_of(d) == Space::Cuda;
  if (!(ctx.dry_run && cuda && d.get_float("run.memory_gib") > 0)) init_device(d);
  return memory_limit(d, cuda, ctx.ranks > 0 && cuda ? 1 : ctx.node_ranks());
}

namespace {
std::string parts_text(const MemoryModel& m, Holder h) {
  std::string s;
  for (const MemoryPart& p : m.parts())
    if (p.holder == h) s += (s.empty() ? "" : ", ") + p.name + " " + gib_str(static_cast<double>(p.bytes));
  return s;
}
}  // namespace

bool admit(const Deck& d, const MemoryModel& m, const MemoryLimit& lim, int cp,
           const std::function<MemoryModel(int)>& at_cp, bool root) {
  const std::string mode = d.get_string("run.memory_check");
  if (mode == "off") return false;
  const double every = static_cast<double>(m.every_rank()), r0 = static_cast<double>(m.rank0());
  if (std::max(every, r0) <= lim.bytes) return false;
  std::ostringstream os;
  os << "a rank of this run needs about " << gib_str(every) << " (" << parts_text(m, Holder::EveryRank) << ")";
  if (m.reference_held()) {
    const std::string before = parts_text(m, Holder::Rank0Before),
                      kept = m.total(Holder::Rank0Kept) ? "kept: " + parts_text(m, Holder::Rank0Kept) : "";
    os << " and rank 0 about " << gib_str(r0) << " with the cp=1 reference (" << before
       << (!before.empty() && !kept.empty() ? "; " : "") << kept << ")";
  }
  os << ", but a rank has " << gib_str(lim.bytes) << " (" << lim.source << ", " << lim.sharing
     << (lim.sharing == 1 ? " rank uses it" : " ranks share it") << "): ";
  if (every > lim.bytes) {
    // More ranks help when some larger CP size fits (the shape rules of that size aside).
    int fits_at = 0;
    double at_max = every;
    for (int k = 2 * cp; k <= 4096 * cp && !fits_at; k *= 2) {
      try {
        at_max = static_cast<double>(at_cp(k).every_rank());
        if (at_max <= lim.bytes) fits_at = k;
      } catch (const std::exception&) {
      }
    }
    if (fits_at)
      os << "use more ranks (about " << gib_str(at_max) << " per rank at cp " << fits_at << ") or lower those sizes";
    else
      os << "more ranks do not make it fit (" << gib_str(at_max) << " per rank at cp " << 4096 * cp
         << "); lower those sizes";
    if (m.reference_held())
      os << "; run.check = \"cross\" checks without the cp=1 reference and the global copies it gathers";
  } else {
    os << "the CP part fits; the cp=1 reference on rank 0 does not: set run.check = \"cross\" (the strategies against "
          "each other, shard by shard) or \"off\"";
  }
  if (mode == "warn") {
    if (root)
      std::fprintf(stderr, "warning: %s: %s (run.memory_check = \"warn\": running anyway)\n", m.keys().c_str(),
                   os.str().c_str());
    return true;
  }
  HCP_INPUT_CHECK(false, m.keys(), os.str(),
                  " (run.memory_check = \"warn\" or \"off\" where this limit is not the truth)");
  return false;
}

}  // namespace hcp::drivers
