// Which cases of a CP driver run: the strategy choice a deck names, the cases that cannot run the
// shape (skipped and reported when the deck asked for all of them), and the validate phase.
#include <algorithm>

#include "common.hpp"
#include "device.hpp"
#include "study.hpp"

namespace hcp::drivers {

Selection select(const Deck& d, const std::string& key, const std::string& all_word, const std::vector<std::string>& all) {
  const std::string v = d.get_string(key);
  if (v == all_word) return {all, true};
  return {{v}, false};
}

std::vector<std::string> runnable(Communicator& comm, const Selection& sel, const std::function<void(const std::string&)>& try_make,
                                  std::vector<std::pair<std::string, std::string>>* skipped) {
  std::vector<std::string> ok;
  std::vector<std::pair<std::string, std::string>> failed;
  for (const std::string& name : sel.names) {
    if (!sel.all) {
      try_make(name);  // a named case that cannot run is the deck's error
      ok.push_back(name);
      continue;
    }
    std::string why;
    if (agree_on_errors(comm, [&] { try_make(name); }, &why, /*print=*/false)) ok.push_back(name);
    else failed.emplace_back(name, why);
  }
  // No case can run: the first one's error is the deck's (e.g. a length that no strategy can split).
  if (ok.empty()) throw Error(failed.front().second);
  if (skipped) *skipped = std::move(failed);
  return ok;
}

void validate_cases(DriverContext& ctx, const Cases& c) {
  save_set(ctx.deck);
  hdf5_io(ctx.deck);
  init_device(ctx.deck);
  const int cp = cp_size_of(ctx.deck, ctx.world->size());
  if (c.footprint) c.footprint(ctx.deck, cp).require_fits(space_of(ctx.deck));
  ProcessGrid grid = ProcessGrid::make(*ctx.world, cp);
  runnable(*grid.cp, select(ctx.deck, c.key, c.all_word, c.all), [&](const std::string& n) { c.make(ctx.deck, *grid.cp, cp, n); });
}

std::vector<std::string> Study::cases(const Cases& c, std::vector<std::pair<std::string, std::string>>* skipped) {
  return runnable(comm, select(deck, c.key, c.all_word, c.all), [&](const std::string& n) { c.make(deck, comm, cp, n); },
                  skipped);
}

}  // namespace hcp::drivers
