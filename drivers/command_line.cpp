// A driver's command line (CLI11) and deck: the informational flags, the deck and its --set
// overrides, the checks every driver shares, then the driver's own validate phase.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>

#include "common.hpp"
#include "cp/strategy.hpp"
#include "harness.hpp"
#include "layer_keys.hpp"
#include "model/mamba2_strategy.hpp"
#include "provenance.hpp"

namespace hcp {

bool prepare_driver(int argc, char** argv, const DriverSpec& spec, DriverContext& ctx) {
  Communicator& world = *ctx.world;
  CLI::App app{spec.description, spec.name};
  std::string deck_path;
  std::vector<std::string> sets;
  bool print_deck = false, help_deck = false, list_strategies = false;
  ctx.out = spec.default_out;
  app.add_option("--deck", deck_path, "input deck (TOML); default: the built-in deck");
  app.add_option("--set", sets, "override a deck value: section.key=value (repeatable)");
  app.add_option("--out", ctx.out, "results file (HDF5)");
  app.set_version_flag("--version", drivers::version_line(spec.name));
  app.add_flag("--print-deck", print_deck, "print the resolved deck and exit");
  app.add_flag("--help-deck", help_deck, "list the deck keys this driver reads and exit");
  app.add_flag("--list-strategies", list_strategies,
               "print the CP strategies this driver runs, one per line (the choices of its strategy key), and exit");
  app.add_flag("--quiet", ctx.quiet, "no progress lines on stderr during long runs");
  app.add_flag("--dry-run", ctx.dry_run,
               "validate the deck, print the memory per rank by part (and the smallest power-of-two cp that fits) "
               "and exit 0; nothing is allocated");
  app.add_option("--ranks", ctx.ranks,
                 "with --dry-run: the number of ranks to estimate for, at most 65536 (default: those launched)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--ranks-per-node", ctx.ranks_per_node,
                 "with --ranks: how many of those ranks share a node (default: all of them, as mpirun -n N on "
                 "this host); sets a2a+p2p's default inner group and a host rank's share of memory")
      ->check(CLI::Range(1, 1 << 16));
  // An option that takes a value, followed by another option or by nothing: name it (CLI11
  // would report the next word as unexpected instead).
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a != "--deck" && a != "--out" && a != "--set" && a != "--ranks") continue;
    if (i + 1 == argc || std::string(argv[i + 1]).rfind("--", 0) == 0)
      throw Error(
          "command line: " + a + " needs a value" +
          (i + 1 == argc ? std::string(" (it is the last word)") : " (got '" + std::string(argv[i + 1]) + "')"));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (world.rank() == 0) std::cout << app.help();
    return true;
  } catch (const CLI::CallForVersion&) {
    if (world.rank() == 0) std::cout << app.version() << "\n";
    return true;
  } catch (const CLI::ParseError& e) {
    throw Error(std::string("command line: ") + e.what());
  }
  if (help_deck) {
    if (world.rank() == 0) std::cout << "deck keys of " << spec.name << ":\n" << spec.schema.describe();
    return true;
  }
  if (list_strategies) {  // the strategy key's choices that are strategies of the registry ("all" aside)
    for (const std::string key : {"parallel.attention", "parallel.mamba_cp"})
      if (const DeckKey* k = spec.schema.find(key)) {
        const auto known = key == "parallel.mamba_cp" ? model::mamba_cp_names() : cp::attn_strategy_names();
        if (world.rank() == 0)
          for (const auto& c : k->choices)
            if (std::find(known.begin(), known.end(), c) != known.end()) std::cout << c << "\n";
        break;
      }
    return true;
  }
  ctx.deck = deck_path.empty() ? Deck::parse(spec.schema, spec.builtin_deck, "<builtin deck>", sets)
                               : Deck::load(spec.schema, deck_path, sets);
  if (print_deck) {
    if (world.rank() == 0) std::cout << ctx.deck.resolved();
    return true;
  }
  if (ctx.ranks > 0 && !ctx.dry_run)
    throw Error("command line: --ranks " + std::to_string(ctx.ranks) + " needs --dry-run");
  if (ctx.ranks_per_node > 0 && ctx.ranks == 0)
    throw Error("command line: --ranks-per-node " + std::to_string(ctx.ranks_per_node) +
                " needs --dry-run --ranks N (a launched run has the nodes it was given)");
  if (ctx.ranks > 0) drivers::dry_run_ranks_per_node() = ctx.node_ranks();
  if (!ctx.out.empty() && !ctx.dry_run) check_output_path(ctx.out, "--out " + ctx.out);
  if (spec.result_tensors && spec.schema.find("run.save")) {
    const std::string bad = drivers::save_set(ctx.deck).unmatched(spec.result_tensors(ctx.deck));
    HCP_INPUT_CHECK(bad.empty(), ctx.deck.where("run.save"), "key 'run.save': item '", bad,
                    "' names no tensor this run writes (a class: all, auto, activations, gradients, timings, ",
                    "comm, memory, summary, inputs; or a tensor such as gradients/<strategy>/<name>: --print-deck and "
                    "h5ls of a results file show them)");
  }
  if (spec.validate) spec.validate(ctx);
  return ctx.dry_run;
}

}  // namespace hcp
