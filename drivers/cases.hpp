// Which cases of a CP driver run: the strategy choice a deck names, the cases that cannot run the
// shape (skipped and reported when the deck asked for all of them), and the validate phase.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "byte_model.hpp"
#include "comm/communicator.hpp"
#include "harness.hpp"
#include "memory_model.hpp"

namespace hcp::drivers {

// The strategy names a choice key selects: the one it names, or every entry of `all` for `all_word`.
// A shape rule is checked where the layer is built, so its message opens with that source line:
// from_input gives the user instead `where` the strategy came from (the rule itself names the keys).
std::string from_input(const std::string& where, const std::string& msg);

struct Selection {
  std::vector<std::string> names;
  bool all = false;
  std::string where;  // where the strategy key was set (deck file:line, --set, or the default)
};
Selection select(const Deck& d, const std::string& key, const std::string& all_word,
                 const std::vector<std::string>& all);

// The cases of `sel` that can run: try_make(name) throws (collectively agreed) when a case's shape
// rules fail. With sel.all such a case is skipped and its reason kept in `skipped`; otherwise, or when
// no case is left, the error stands. Collective over `comm`.
std::vector<std::string> runnable(Communicator& comm, const Selection& sel,
                                  const std::function<void(const std::string&)>& try_make,
                                  std::vector<std::pair<std::string, std::string>>* skipped = nullptr);

// A driver's cases: the choice key and its word for "all of them", every case name, and make(deck,
// comm, cp, name), which builds the case (its constructor checks the shape rules) or throws.
struct Cases {
  std::string key, all_word;
  std::vector<std::string> all;
  std::function<void(const Deck&, Communicator&, int, const std::string&)> make;
  // The memory model of case `name` at CP size cp (memory_model.hpp): the validate phase refuses a
  // run whose largest case cannot fit, --dry-run prints it, and each case's memory line shows it
  // beside the measured high-water.
  std::function<MemoryModel(const Deck&, int cp, const std::string& name)> memory;
  // The bytes per rank of every strategy of each layer kind the driver runs (byte_model.hpp):
  // --dry-run prints them as a BYTES line.
  std::function<LayerBytes(const Deck&, int cp)> bytes;
};
// fn(group) for the CP group a run's shape rules are checked on: this run's own, or for a dry run
// of --ranks N (ranks not launched) a ShapeCommunicator group as its first rank and as its last sees
// it. Collective over the world in the first case.
void for_cp_groups(const DriverContext& ctx, int cp, const std::function<void(Communicator&)>& fn);
// The validate phase of a CP driver: the GPU of run.device, the process grid, and the cases the
// deck names (a skipped case is no error; runnable's rules).
void validate_cases(DriverContext& ctx, const Cases& c);
// Dataset paths "/<group>/<case>/<name>" for every case of `c`, the case the deck names and the cp=1
// reference, each group with its names (a driver's DriverSpec::result_tensors).
using TensorGroups = std::vector<std::pair<std::string, std::vector<std::string>>>;
std::vector<std::string> case_tensors(const Cases& c, const Deck& d, const TensorGroups& groups);

// The spec of a driver that runs the cases of `cases()` as one study: `run` runs them, the validate
// phase is validate_cases, and run.save's tensor names are checked against case_tensors of `groups`
// (the /activations and /gradients names of one case).
struct StudyDriver {
  std::string name, description;
  DeckSchema schema;
  std::string builtin_deck, default_out;
  Cases (*cases)();
  void (*run)(DriverContext&);
  TensorGroups (*groups)(const Deck&);
};
DriverSpec study_driver(const StudyDriver& s);

}  // namespace hcp::drivers
