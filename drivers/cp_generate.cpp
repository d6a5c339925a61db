// cp_generate: long-context inference of the hybrid model under CP. The prompts (packed THD or
// BSHD) are prefilled forward-only across the CP group with each attention strategy and the deck's
// Mamba strategy; each Mamba2 layer hands its conv windows and SSM states, each attention layer its
// K/V shard, to decode where they were computed (model/decode.hpp); then generate.new_tokens tokens
// per sequence are generated, greedy or sampled. Checked against cp = 1 on rank 0: the generated ids
// equal those of the cp = 1 prefill and decode, and the logits of every generated token equal a cp = 1
// forward over the prompt and the tokens generated before it (teacher forcing).

#include "common.hpp"
#include "device.hpp"
#include "generate_study.hpp"
#include "hybrid_common.hpp"

using namespace hcp;

namespace {
const std::string kDeck = "# Built-in deck of cp_generate: a small NemotronV3-style stack on packed THD prompts.\n" +
                          drivers::builtin_model_deck(64) + R"([data]
format = "thd"
seq_lens = "120, 37, 90"
dtype = "fp64"
seed = 1

[generate]
new_tokens = 8
sampling = "greedy"

[parallel]
attention = "all"   # p2p | allgather | a2a | a2a_p2p | all
mamba_cp = "hidden_parallel"

[run]
warmup = 0
repeats = 1
check = "reference"
)";

DeckSchema schema() {
  DeckSchema s;
  drivers::add_hybrid_model_keys(s, drivers::attention_choices(true), "all");
  drivers::add_cp_driver_keys(s, "120, 37, 90", 128, /*with_bf16=*/true);
  drivers::add_generate_keys(s);
  drivers::add_device_key(s);
  return s;
}

drivers::Cases cases() {
  return {"parallel.attention",
          "all",
          drivers::attention_choices(false),
          drivers::make_hybrid_case,
          [](const Deck& d, int cp, const std::string& n) {
            const model::HybridConfig h = drivers::hybrid_config(d, n, cp);
            return drivers::generate_memory(d, h, cp, drivers::ep_size_of(d, h, cp));
          },
          [](const Deck& d, int cp) {
            const model::HybridConfig h = drivers::hybrid_config(d, "p2p", cp);
            return drivers::generate_bytes(d, h, cp);
          }};
}

void run(DriverContext& ctx) {
  drivers::Study st(ctx, "cp_generate", drivers::model_tolerance);
  drivers::GenerateStudy g(st);
  st.run(cases(),
         {[&](const std::vector<std::string>& names, const drivers::Skipped& skipped) { g.setup(names, skipped); },
          g.columns(),
          [&](const std::string& name, std::vector<std::string>& row) { return g.run_case(name, row); },
          {},
          "a CP generation differs from cp=1: other ids, logits beyond tolerance of teacher forcing, ranks that "
          "disagree, or decode bytes or the prefill's attention or Mamba2 bytes other than the model's"});
}
}  // namespace

int main(int argc, char** argv) {
  return run_driver(argc, argv,
                    drivers::study_driver({"cp_generate",
                                           "hybrid model inference: CP prefill, hand-off of Mamba2 states and KV "
                                           "shards, decode; against cp=1 generation and teacher forcing",
                                           schema(), kDeck, "cp_generate.h5", cases, run,
                                           [](const Deck&) -> drivers::TensorGroups { return {}; }}));
}
