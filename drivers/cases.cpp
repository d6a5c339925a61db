// Which cases of a CP driver run: the strategy choice a deck names, the cases that cannot run the
// shape (skipped and reported when the deck asked for all of them), and the validate phase.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <regex>

#include "cases.hpp"

#include "comm/shape_communicator.hpp"

#include "common.hpp"
#include "device.hpp"
#include "memory_admission.hpp"
#include "table.hpp"

namespace hcp::drivers {

Selection select(const Deck& d, const std::string& key, const std::string& all_word,
                 const std::vector<std::string>& all) {
  const std::string v = d.get_string(key);
  if (v == all_word) return {all, true, d.where(key)};
  return {{v}, false, d.where(key)};
}

std::string from_input(const std::string& where, const std::string& msg) {
  static const std::regex source(R"(^(src|kernels|drivers)/[^: ]+:[0-9]+: )");
  std::smatch m;
  return std::regex_search(msg, m, source) ? where + ": " + m.suffix().str() : msg;
}

std::vector<std::string> runnable(Communicator& comm, const Selection& sel,
                                  const std::function<void(const std::string&)>& try_make,
                                  std::vector<std::pair<std::string, std::string>>* skipped) {
  std::vector<std::string> ok;
  std::vector<std::pair<std::string, std::string>> failed;
  const auto make = [&](const std::string& name) {
    try {
      try_make(name);
    } catch (const Error& e) {
      throw Error(from_input(sel.where, e.what()));
    }
  };
  for (const std::string& name : sel.names) {
    if (!sel.all) {
      make(name);  // a named case that cannot run is the deck's error
      ok.push_back(name);
      continue;
    }
    std::string why;
    if (agree_on_errors(
            comm, [&] { make(name); }, &why, /*print=*/false))
      ok.push_back(name);
    else
      failed.emplace_back(name, why);
  }
  // No case can run: the first one's error is the deck's (e.g. a length that no strategy can split).
  if (ok.empty()) throw Error(failed.front().second);
  if (skipped) *skipped = std::move(failed);
  return ok;
}

void for_cp_groups(const DriverContext& ctx, int cp, const std::function<void(Communicator&)>& fn) {
  const int world = ctx.world_size();
  if (world == ctx.world->size() && ctx.ranks == 0) {
    ProcessGrid grid = ProcessGrid::make(*ctx.world, cp);
    fn(*grid.cp);
    return;
  }
  // --ranks N: the first and the last rank of the first CP group stand for every rank (the shape
  // rules read the group's size, and a rank's place only at the ends of a token layout).
  for (const int r : cp > 1 ? std::vector<int>{0, cp - 1} : std::vector<int>{0}) {
    const ShapeCommunicator shape(world, r);
    ProcessGrid grid = ProcessGrid::make(shape, cp);
    fn(*grid.cp);
  }
}

// The model of the case with the largest (or smallest) peak among `names`.
static MemoryModel by_peak(const Cases& c, const Deck& d, int cp, const std::vector<std::string>& names, bool largest) {
  std::optional<MemoryModel> best;
  for (const std::string& n : names) {
    MemoryModel m = c.memory(d, cp, n);
    if (!best || (largest ? m.peak() > best->peak() : m.peak() < best->peak())) best = std::move(m);
  }
  return *best;
}

void validate_cases(DriverContext& ctx, const Cases& c) {
  const Deck& d = ctx.deck;
  save_set(d);
  hdf5_io(d);
  const MemoryLimit lim = device_and_limit(ctx);
  const int world = ctx.world_size(), cp = cp_size_of(d, world);
  const Selection sel = select(d, c.key, c.all_word, c.all);
  const std::string& plant = d.get_string("run.plant_fault");
  HCP_INPUT_CHECK(plant.empty() || std::find(c.all.begin(), c.all.end(), plant) != c.all.end(),
                  d.where("run.plant_fault"), "key 'run.plant_fault' = \"", plant, "\" is not a case of this driver (",
                  join(c.all), ")");
  HCP_INPUT_CHECK(
      plant.empty() || check_mode(d) != CheckMode::Off, d.where("run.plant_fault"),
      "key 'run.plant_fault' needs run.check = \"reference\" or \"cross\" (a fault no check sees proves nothing)");
  // Sizes that cannot fit even in the smallest case are refused before the cases' shape rules are
  // tried (building a case builds its token layout); "warn" warns once, below. A dry run, arithmetic
  // only, builds no case for them either (the model refuses sizes that overflow, as a run's does).
  const MemoryModel smallest = by_peak(c, d, cp, sel.names, false);
  if (!ctx.dry_run && d.get_string("run.memory_check") == "refuse")
    admit(
        d, smallest, lim, cp, [&](int k) { return by_peak(c, d, k, sel.names, false); }, ctx.root());
  const bool dry_too_big = ctx.dry_run && static_cast<double>(smallest.peak()) > lim.bytes;
  std::vector<std::string> names = sel.names;
  if (!dry_too_big)  // a run's shape rules, on its CP group or, for --ranks, on shape groups
    for_cp_groups(ctx, cp, [&](Communicator& group) {
      names = runnable(group, {names, sel.all, sel.where}, [&](const std::string& n) { c.make(d, group, cp, n); });
    });
  // A planted fault must meet a check: its case runs here, and a cross check has another case to
  // compare it with.
  HCP_INPUT_CHECK(plant.empty() || std::find(names.begin(), names.end(), plant) != names.end(),
                  d.where("run.plant_fault"), "key 'run.plant_fault' = \"", plant,
                  "\" names a case that does not run here (", c.key, " runs ", join(names),
                  "): a fault no check sees proves nothing");
  HCP_INPUT_CHECK(plant.empty() || check_mode(d) != CheckMode::Cross || names.size() >= 2, d.where("run.plant_fault"),
                  "key 'run.plant_fault' with run.check = \"cross\" needs two cases or more (", c.key, " runs ",
                  join(names), "): cross compares each case with the first, so one case is compared with nothing");
  const auto at_cp = [&](int k) { return by_peak(c, d, k, names, true); };
  const MemoryModel m = at_cp(cp);
  if (ctx.dry_run) {
    if (ctx.root()) {
      print_memory(m, lim, cp, world, ctx.driver, at_cp);
      if (c.bytes) std::printf("BYTES %s\n", bytes_json(ctx.driver, cp, c.bytes(d, cp)).c_str());
    }
    return;
  }
  if (admit(d, m, lim, cp, at_cp, ctx.root())) ctx.memory_warned = m.keys();
}

std::vector<std::string> case_tensors(const Cases& c, const Deck& d, const TensorGroups& groups) {
  std::vector<std::string> cases = c.all, out;
  for (const std::string& n : select(d, c.key, c.all_word, c.all).names)  // a per-layer list is a case of its own
    if (std::find(cases.begin(), cases.end(), n) == cases.end()) cases.push_back(n);
  cases.push_back("reference");
  for (const auto& cs : cases)
    for (const auto& [group, names] : groups)
      for (const auto& n : names) out.push_back("/" + group + "/" + cs + "/" + n);
  return out;
}

DriverSpec study_driver(const StudyDriver& s) {
  return {s.name,
          s.description,
          s.schema,
          s.builtin_deck,
          s.default_out,
          [cases = s.cases](DriverContext& c) { validate_cases(c, cases()); },
          s.run,
          [cases = s.cases, groups = s.groups](const Deck& d) { return case_tensors(cases(), d, groups(d)); }};
}

}  // namespace hcp::drivers
