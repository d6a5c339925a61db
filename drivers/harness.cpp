#include "harness.hpp"
#include "model/mamba2_strategy.hpp"

#include <mpi.h>

#include <unistd.h>
#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "cases.hpp"
#include "comm/mpi_communicator.hpp"
#include "common.hpp"
#include "core/error.hpp"
#include "cp/strategy.hpp"
#include "layer_keys.hpp"
#include "provenance.hpp"

#ifndef HCP_GIT_REV
#define HCP_GIT_REV "unknown"
#endif

namespace hcp {

int DriverContext::node_ranks() const {
  if (ranks > 0) return ranks_per_node > 0 ? std::min(ranks_per_node, ranks) : ranks;
  int local = 1;
  node_local_rank(&local);
  return local;
}

bool agree_on_errors(Communicator& comm, const std::function<void()>& fn, std::string* message, bool print) {
  std::string msg;
  double failed = 0;
  try {
    fn();
  } catch (const std::exception& e) {
    msg = e.what();
    failed = 1;
  }
  // Lowest failing rank (size() when none).
  double first = failed ? comm.rank() : comm.size();
  first = -comm.all_reduce_scalar(-first, ReduceOp::Max);
  if (first >= comm.size()) return true;
  // Ship that rank's message to rank 0 (fixed-size buffer keeps it one collective).
  std::vector<double> len(1, static_cast<double>(msg.size()));
  const int src = static_cast<int>(first);
  comm.broadcast(len.data(), 1, DType::F64, src);
  std::string text(static_cast<std::size_t>(len[0]), ' ');
  if (comm.rank() == src) text = msg;
  std::vector<float> buf(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) buf[i] = static_cast<float>(static_cast<unsigned char>(text[i]));
  if (!buf.empty()) comm.broadcast(buf.data(), static_cast<std::int64_t>(buf.size()), DType::F32, src);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(static_cast<unsigned char>(buf[i]));
  if (message) *message = text;
  if (print && comm.rank() == 0) std::fprintf(stderr, "error: %s\n", text.c_str());
  return false;
}

void check_output_path(const std::string& out, const std::string& where) {
  namespace fs = std::filesystem;
  std::error_code ec;
  HCP_INPUT_CHECK(!fs::is_directory(out, ec), where, "is a directory (give a file name)");
  const fs::path dir = fs::path(out).has_parent_path() ? fs::path(out).parent_path() : fs::path(".");
  HCP_INPUT_CHECK(fs::is_directory(dir, ec), where, "folder '", dir.string(), "' does not exist");
  HCP_INPUT_CHECK(::access(dir.c_str(), W_OK) == 0, where, "folder '", dir.string(), "' is not writable (",
                  std::strerror(errno), ")");
}

int run_driver(int argc, char** argv, const DriverSpec& spec) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    // Kokkos sees only its own --kokkos-* options: --help and --version are the driver's.
    std::vector<char*> kargs{argv[0]};
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]).rfind("--kokkos", 0) == 0) kargs.push_back(argv[i]);
    int kargc = static_cast<int>(kargs.size());
    Kokkos::initialize(kargc, kargs.data());
    {
      MpiCommunicator world(MPI_COMM_WORLD);
      drivers::ranks_per_node();  // collective once, on every rank, before any deck-dependent code asks
      DriverContext ctx;
      ctx.world = &world;
      ctx.provenance = drivers::run_provenance(world);  // collective: rank 0's host and date everywhere
      ctx.git_rev = HCP_GIT_REV;
      ctx.driver = spec.name;
      for (int i = 0; i < argc; ++i) ctx.cmdline += (i ? " " : "") + std::string(argv[i]);
      ctx.cmdline = drivers::launch_line(ctx.cmdline);  // rank 0's is the file's (mpirun's line where it launched)

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
      app.add_flag(
          "--list-strategies", list_strategies,
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
      bool exit_now = false;
      bool ok = agree_on_errors(world, [&] {
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
          exit_now = true;
          return;
        } catch (const CLI::CallForVersion&) {
          if (world.rank() == 0) std::cout << app.version() << "\n";
          exit_now = true;
          return;
        } catch (const CLI::ParseError& e) {
          throw Error(std::string("command line: ") + e.what());
        }
        if (help_deck) {
          if (world.rank() == 0) std::cout << "deck keys of " << spec.name << ":\n" << spec.schema.describe();
          exit_now = true;
          return;
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
          exit_now = true;
          return;
        }
        ctx.deck = deck_path.empty() ? Deck::parse(spec.schema, spec.builtin_deck, "<builtin deck>", sets)
                                     : Deck::load(spec.schema, deck_path, sets);
        if (print_deck) {
          if (world.rank() == 0) std::cout << ctx.deck.resolved();
          exit_now = true;
          return;
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
          HCP_INPUT_CHECK(
              bad.empty(), ctx.deck.where("run.save"), "key 'run.save': item '", bad,
              "' names no tensor this run writes (a class: all, auto, activations, gradients, timings, ",
              "comm, memory, summary, inputs; or a tensor such as gradients/<strategy>/<name>: --print-deck and "
              "h5ls of a results file show them)");
        }
        if (spec.validate) spec.validate(ctx);
        if (ctx.dry_run) exit_now = true;
      });
      if (!ok) {
        status = 2;
      } else if (!exit_now) {
        try {
          spec.run(ctx);
        } catch (const CheckFailed& e) {
          if (world.rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
          std::fflush(stderr);
          status = 1;
        } catch (const std::exception& e) {
          // After run.memory_check = "warn" let refused sizes run, the error opens with where they came from.
          const std::string msg = ctx.memory_warned.empty() ? e.what()
                                                            : drivers::from_input(ctx.memory_warned, e.what()) +
                                                                  " (run.memory_check = \"warn\" ran sizes the "
                                                                  "memory model does not fit on a rank)";
          std::fprintf(stderr, "[rank %d] error: %s\n", world.rank(), msg.c_str());
          std::fflush(stderr);
          MPI_Abort(MPI_COMM_WORLD, 3);
        }
      }
    }
    Kokkos::finalize();
  }
  MPI_Finalize();
  return status;
}

}  // namespace hcp
