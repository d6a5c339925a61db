// Common driver harness: MPI -> Kokkos -> command line (CLI11) -> deck (TOML) -> run -> finalize.
// Two error phases:
//  * validate: the same on every rank (deck, shapes that must divide, sizes vs ranks). Errors are
//    agreed on collectively: rank 0 prints one message, every rank exits with status 2.
//  * run: any error on any rank prints "[rank r] error: ..." and MPI_Abort ends every rank (status 3).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "io/deck.hpp"

namespace hcp {

struct DriverContext {
  Communicator* world = nullptr;
  Deck deck;
  std::string driver;                             // the driver's name
  std::string out;                                // results file (--out), "" for none
  std::string cmdline;                            // the command line, for /config
  std::string git_rev;                            // the build's git revision
  std::map<std::string, std::string> provenance;  // host, date, libraries, ... (provenance.hpp), for /config
  bool quiet = false;
  // --dry-run: validate, print the memory estimate by part and exit 0 (nothing allocated);
  // `ranks` (--ranks N, > 0) the world size to estimate for instead of the launched one.
  // `ranks_per_node` (--ranks-per-node M) how many of those N share a node (default: all N, as
  // `mpirun -n N` on one host): a2a+p2p's default inner group and a host rank's share of memory.
  bool dry_run = false;
  int ranks = 0, ranks_per_node = 0;
  // Set when run.memory_check = "warn" let sizes the memory model refused run: where they came from
  // and their keys (MemoryModel::keys). An error of the run then opens with it.
  std::string memory_warned;
  int world_size() const { return ranks > 0 ? ranks : world->size(); }
  // Ranks of the run per node: --ranks-per-node (at most --ranks), all of --ranks, or those launched here.
  int node_ranks() const;
  bool root() const { return world->rank() == 0; }
};

struct DriverSpec {
  std::string name, description;
  DeckSchema schema;
  std::string builtin_deck;                      // used when --deck is not given
  std::string default_out;                       // default --out ("" = no file)
  std::function<void(DriverContext&)> validate;  // optional, collective error agreement
  std::function<void(DriverContext&)> run;
  // The /activations and /gradients datasets a run of this deck writes, for run.save's check (a
  // tensor name in run.save must name one of them); absent: no check.
  std::function<std::vector<std::string>(const Deck&)> result_tensors;
};

// A file can be created at `path` (its folder exists and is writable, it is not a folder): checked
// before any work, so that a long run does not end on "cannot create". `where` names the input
// (e.g. "--out F" or the deck line of a key).
void check_output_path(const std::string& path, const std::string& where);

// A run that completed and whose check failed (a result beyond tolerance, bytes off the model):
// thrown on every rank alike, it ends the run with exit 1 (exit 3 is a failure during the run).
class CheckFailed : public Error {
 public:
  explicit CheckFailed(const std::string& why) : Error(why) {}
};

// Runs the driver: exit 0 (done; PASS or UNCHECKED), 1 (a check failed), 2 (bad input, refused
// before any work), 3 (a failure during the run: every rank ends).
int run_driver(int argc, char** argv, const DriverSpec& spec);
// The command line and the deck: --help, --version, --help-deck, --list-strategies and --print-deck
// answered, the deck loaded with its --set overrides and checked, the driver's validate phase run.
// True when the driver has nothing more to do (one of those answered, or --dry-run). Throws
// hcp::Error on bad input.
bool prepare_driver(int argc, char** argv, const DriverSpec& spec, DriverContext& ctx);

// Agree on an error across ranks: if any rank's `fn` throws, rank 0 prints the lowest failing
// rank's message and every rank returns false. Used by run_driver and the tests.
bool agree_on_errors(Communicator& comm, const std::function<void()>& fn, std::string* message = nullptr,
                     bool print = true);

}  // namespace hcp
