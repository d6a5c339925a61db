// The --dry-run report of a memory model: its parts, the total against the limit, the smallest CP
// size that fits, and one machine-readable line.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "memory_admission.hpp"

namespace hcp::drivers {

void print_memory(const MemoryModel& m, const MemoryLimit& lim, int cp, int world, const std::string& driver,
                  const std::function<MemoryModel(int)>& at_cp) {
  const char* holder[] = {"every rank", "rank 0, beside the cases", "rank 0, before the cases"};
  std::printf("# %s --dry-run: %d ranks, cp %d; memory per rank (estimate of tensor storage)\n", driver.c_str(), world,
              cp);
  for (const MemoryPart& p : m.parts())
    std::printf("  %-28s %-26s %12.4f GiB\n", p.name.c_str(), holder[static_cast<int>(p.holder)],
                gib(static_cast<double>(p.bytes)));
  const bool fits = static_cast<double>(m.peak()) <= lim.bytes;
  std::printf("# every rank %.4f GiB, rank 0 %.4f GiB; limit %.4f GiB per rank (%s): %s\n",
              gib(static_cast<double>(m.every_rank())), gib(static_cast<double>(m.rank0())), gib(lim.bytes),
              lim.source.c_str(), fits ? "fits" : "does not fit");
  // The smallest power-of-two CP size whose ranks fit (the reference on rank 0 as the deck says).
  int smallest = 0;
  for (int c = 1; c <= (1 << 20) && std::isfinite(lim.bytes); c *= 2) {
    try {
      if (static_cast<double>(at_cp(c).peak()) <= lim.bytes) {
        smallest = c;
        break;
      }
    } catch (const std::exception&) {
    }
  }
  if (smallest) std::printf("# smallest power-of-two cp that fits: %d\n", smallest);
  std::ostringstream js;
  js << "{\"driver\":\"" << driver << "\",\"world\":" << world << ",\"cp\":" << cp
     << ",\"every_rank\":" << m.every_rank() << ",\"rank0\":" << m.rank0() << ",\"limit\":";
  if (std::isfinite(lim.bytes))
    js << static_cast<std::int64_t>(lim.bytes);
  else
    js << "null";
  js << ",\"fits\":" << (fits ? "true" : "false") << ",\"smallest_cp\":" << smallest << ",\"parts\":{";
  for (std::size_t i = 0; i < m.parts().size(); ++i) {
    const MemoryPart& p = m.parts()[i];
    js << (i ? "," : "") << '"' << p.name;
    if (p.holder != Holder::EveryRank) js << " (" << holder[static_cast<int>(p.holder)] << ")";
    js << "\":" << p.bytes;
  }
  std::printf("MEMORY %s}}\n", js.str().c_str());
}

}  // namespace hcp::drivers
