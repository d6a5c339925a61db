// cp_mamba: one Mamba2 mixer layer under CP against cp=1, for the hidden-parallel and/or the
// state-passing strategy (parallel.mamba_cp): output, input gradient and every parameter gradient
// (gathered / summed), per-rank and per-phase timings, bytes of every communication op against the
// strategy's cost model, written to HDF5.

#include <cstdio>

#include "common.hpp"
#include "device.hpp"
#include "layer_keys.hpp"
#include "mamba_study.hpp"

using namespace hcp;

namespace {
const char* kDeck = R"(# Built-in deck of cp_mamba: a packed THD batch through one Mamba2 mixer, both CP strategies.
[mamba]
hidden = 64
heads = 8          # hidden_parallel: divisible by cp
head_dim = 16
n_groups = 2       # hidden_parallel: n_groups % cp == 0, or cp % n_groups == 0 (groups repeated)
d_state = 16
conv = 4
chunk = 32

[data]
format = "thd"
seq_lens = "100, 37, 250"
batch = 2
seqlen = 256
dtype = "fp64"
seed = 1

[parallel]
cp_size = 0
mamba_cp = "all"   # hidden_parallel | state_passing | all

[run]
warmup = 1
repeats = 3
check = "reference"
)";

DeckSchema schema() {
  DeckSchema s;
  s.add_int("mamba.hidden", 64, "model width", 1);
  drivers::add_mamba_keys(s, {.heads = 8, .head_dim = 16, .groups = 2, .d_state = 16, .conv = 4, .chunk = 32});
  drivers::add_cp_driver_keys(s, "100, 37, 250", 256, /*with_bf16=*/true);
  drivers::add_partition_keys(s);
  drivers::add_device_key(s);
  std::vector<std::string> choices = model::mamba_cp_names();
  choices.emplace_back("all");
  s.add_string("parallel.mamba_cp", "all", "Mamba CP strategy (all: each in turn)", choices)
      .rename_choice("parallel.mamba_cp", "both", "all");
  return s;
}

// The strategies; constructing a layer checks its divisibility rules.
drivers::Cases cases() {
  return {"parallel.mamba_cp",
          "all",
          model::mamba_cp_names(),
          [](const Deck& d, Communicator& c, int cp, const std::string& n) {
            drivers::mamba_setup(d, cp).make(model::mamba_cp_from_string(n), c);
          },
          drivers::mamba_memory,
          [](const Deck& d, int cp) {
            const drivers::MambaSetup s = drivers::mamba_setup(d, cp);
            drivers::LayerBytes b;
            drivers::add_mamba_bytes(b, s.cfg, s.placement, s.dt);
            drivers::add_placement(b, d, cp, drivers::token_doc_cost());
            return b;
          }};
}

void run(DriverContext& ctx) {
  drivers::Study st(ctx, "cp_mamba", drivers::layer_tolerance);
  drivers::MambaStudy m(st);
  st.run(cases(),
         {[&](const std::vector<std::string>& names, const drivers::Skipped& skipped) { m.setup(names, skipped); },
          {{"strategy", 16},
           {"fwd_ms", 10},
           {"bwd_ms", 10},
           {"bytes/rank", 14},
           {"model", 14},
           {"allreduce_B", 14},
           {"max_rel_err", 12}},
          [&](const std::string& name, std::vector<std::string>& row) { return m.run_case(name, row); },
          [&] { m.notes(); },
          "a CP result differs beyond tolerance from what run.check compares it with (the cp=1 reference or the "
          "first case), or bytes from the model",
          [] {
            std::printf("# bytes/rank: sent per step (forward + backward), max over ranks; model: the cost model\n");
          }});
}
}  // namespace

int main(int argc, char** argv) {
  return run_driver(
      argc, argv,
      drivers::study_driver(
          {"cp_mamba", "Mamba2 mixer under hidden-parallel and state-passing context parallelism against cp=1",
           schema(), kDeck, "cp_mamba.h5", cases, run, [](const Deck& d) -> drivers::TensorGroups {
             std::vector<std::string> grads{"input"};
             for (const auto& p : model::mamba2_params(drivers::mamba_from_deck(d, d.get_int("mamba.hidden"))))
               grads.push_back(p.name);
             return {{"activations", {"out"}}, {"gradients", grads}};
           }}));
}
