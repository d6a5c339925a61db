// cp_attention: one attention layer under context parallelism. For each strategy (p2p ring,
// all-gather, Ulysses a2a) it runs forward+backward on the CP group, compares outputs and input
// gradients (gathered to global order) with a cp=1 run, times compute and communication per rank,
// checks the bytes against each strategy's model and writes everything to HDF5. Packed documents lie
// DualChunkSwap-padded on every rank, or (data.partition = documents) whole on one rank or split.

#include <cstdio>
#include "attention_study.hpp"

#include "common.hpp"
#include "device.hpp"
#include "layer_keys.hpp"

using namespace hcp;

namespace {

const char* kBuiltinDeck = R"(# Built-in deck of cp_attention: a small packed (THD) batch, every strategy.
[attention]
heads = 8          # query heads
kv_heads = 2       # GQA: 4 query heads per K/V head
head_dim = 32
causal = true

[data]
format = "thd"              # "bshd" (batch x seqlen) or "thd" (packed sequences)
seq_lens = "200, 56, 500"   # THD: lengths before padding to a multiple of 2*cp
batch = 2                   # BSHD only
seqlen = 512                # BSHD only (multiple of 2*cp)
dtype = "fp64"
seed = 1

[parallel]
cp_size = 0                 # 0: all ranks form one CP group
attention = "all"           # p2p | allgather | a2a | a2a+p2p | all
cp_inner = 0                # a2a+p2p inner group (0: the ranks of a node)

[run]
warmup = 1
repeats = 3
check = "reference"         # reference (cp=1 on rank 0) | cross (strategies against each other) | off
)";

DeckSchema schema() {
  DeckSchema s;
  drivers::add_attention_keys(s, {8, 2, 32});
  s.add_bool("attention.causal", true, "causal mask (false: full attention)")
      .add_string("parallel.attention", "all", "attention CP strategy (all: each in turn)",
                  drivers::attention_choices(true))
      .rename_key("parallel.strategy", "parallel.attention");
  drivers::add_cp_inner_key(s);
  drivers::add_cp_driver_keys(s, "200, 56, 500", 512, /*with_bf16=*/true);
  drivers::add_partition_keys(s);
  drivers::add_device_key(s);
  return s;
}

// The strategies; constructing one checks its divisibility rules (e.g. a2a: heads % cp).
drivers::Cases cases() {
  return {"parallel.attention",
          "all",
          drivers::attention_choices(false),
          [](const Deck& d, Communicator& c, int cp, const std::string& n) {
            cp::CpAttention a(c, drivers::attention_config(d, cp, n));
          },
          drivers::attention_memory,
          [](const Deck& d, int cp) {
            drivers::LayerBytes b;
            const cp::CpAttnConfig c = drivers::attention_config(d, cp, "p2p");
            drivers::add_attention_bytes(b, c, dtype_from_string(d.get_string("data.dtype")));
            drivers::add_placement(b, d, cp, drivers::attention_doc_cost(c.causal));
            return b;
          }};
}

void run(DriverContext& ctx) {
  drivers::Study st(ctx, "cp_attention", drivers::layer_tolerance);
  drivers::AttentionStudy a(st);
  st.run(cases(),
         {[&](const std::vector<std::string>& names, const drivers::Skipped& skipped) { a.setup(names, skipped); },
          {{"strategy", 9},
           {"fwd_ms", 10},
           {"bwd_ms", 10},
           {"compute_ms", 10},
           {"comm_ms", 10},
           {"overlap", 8},
           {"bytes/rank", 12},
           {"model_bytes", 12},
           {"err_o", 10},
           {"err_dq", 10},
           {"err_dk", 10},
           {"err_dv", 10},
           {"pass", 5}},
          [&](const std::string& name, std::vector<std::string>& row) { return a.run_case(name, row); },
          [&] {
            std::printf(st.cross ? "# errors (run.check = cross): max |case - first case| / max |first case| per "
                                   "tensor; tolerance %.0e (%s)\n"
                                 : "# errors: max |cp - cp1| / max |cp1| per tensor; tolerance %.0e (%s)\n",
                        st.tol, to_string(st.dt).c_str());
          },
          "a CP result differs beyond tolerance from what run.check compares it with (the cp=1 reference or the "
          "first case), or bytes from the model"});
}

}  // namespace

int main(int argc, char** argv) {
  return run_driver(argc, argv,
                    drivers::study_driver({"cp_attention",
                                           "Attention context parallelism (p2p ring, all-gather, Ulysses a2a, "
                                           "a2a+p2p) against cp=1",
                                           schema(), kBuiltinDeck, "cp_attention.h5", cases, run,
                                           [](const Deck&) -> drivers::TensorGroups {
                                             return {{"activations", {"out"}}, {"gradients", {"dq", "dk", "dv"}}};
                                           }}));
}
