// cp_hybrid: one forward/backward step of the hybrid model under CP for each attention strategy,
// against cp=1 on the same padded batch: loss, logits gradient, every block's output and every
// parameter gradient; per-phase timings and bytes per communication op, written to HDF5.

#include "common.hpp"
#include "device.hpp"
#include "hybrid_common.hpp"
#include "hybrid_study.hpp"

using namespace hcp;

namespace {
const std::string kDeck = "# Built-in deck of cp_hybrid: a small NemotronV3-style stack on a packed THD batch.\n" +
                          drivers::builtin_model_deck(64) + R"([data]
format = "thd"
seq_lens = "120, 37, 90"
dtype = "fp64"
seed = 1

[parallel]
attention = "all"   # p2p | allgather | a2a | all
mamba_cp = "hidden_parallel"

[run]
warmup = 1
repeats = 3
check = "reference"
)";

DeckSchema schema() {
  DeckSchema s;
  drivers::add_hybrid_model_keys(s, drivers::attention_choices(true), "all");
  drivers::add_cp_driver_keys(s, "120, 37, 90", 128, /*with_bf16=*/true);
  drivers::add_partition_keys(s);
  drivers::add_device_key(s);
  return s;
}

// The attention strategies; building the model checks every layer's divisibility rules.
drivers::Cases cases() {
  return {"parallel.attention",
          "all",
          drivers::attention_choices(false),
          drivers::make_hybrid_case,
          [](const Deck& d, int cp, const std::string& n) {
            const model::HybridConfig h = drivers::hybrid_config(d, n, cp);
            return drivers::hybrid_memory(d, h, cp, drivers::ep_size_of(d, h, cp));
          },
          [](const Deck& d, int cp) {
            const model::HybridConfig h = drivers::hybrid_config(d, "p2p", cp);
            const cp::Placement p = drivers::placement_of(d, cp, model::hybrid_doc_cost(h));
            const DType dt = dtype_from_string(d.get_string("data.dtype"));
            drivers::LayerBytes b;
            if (h.pattern.find('*') != std::string::npos)
              drivers::add_attention_bytes(b, model::cp_attn_config(h.attn, p), dt);
            if (h.pattern.find('M') != std::string::npos) drivers::add_mamba_bytes(b, h.mamba, p, dt);
            drivers::add_placement(b, d, cp, model::hybrid_doc_cost(h));
            if (h.pattern.find('E') != std::string::npos)
              drivers::add_moe_bytes(b, h.moe, h.hidden, p.global.total() / cp, cp, drivers::ep_size_of(d, h, cp), dt);
            return b;
          }};
}

void run(DriverContext& ctx) {
  drivers::Study st(ctx, "cp_hybrid", drivers::model_tolerance);
  drivers::HybridStudy h(st);
  st.run(cases(),
         {[&](const std::vector<std::string>& names, const drivers::Skipped& skipped) { h.setup(names, skipped); },
          h.columns(),
          [&](const std::string& name, std::vector<std::string>& row) { return h.run_case(name, row); },
          {},
          "a CP result differs beyond tolerance from what run.check compares it with (the cp=1 reference or the "
          "first case)"});
}
}  // namespace

int main(int argc, char** argv) {
  return run_driver(
      argc, argv,
      drivers::study_driver(
          {"cp_hybrid",
           "hybrid Mamba2 + attention + MoE model, one step under CP for each attention strategy, against cp=1",
           schema(), kDeck, "cp_hybrid.h5", cases, run, [](const Deck& d) -> drivers::TensorGroups {
             const model::HybridConfig h = drivers::hybrid_config(d, "p2p", 1);
             std::vector<std::string> blocks, grads = model::hybrid_param_names(h);
             for (std::size_t i = 0; i < h.pattern.size(); ++i) blocks.push_back("block_" + std::to_string(i));
             grads.push_back("logits");
             return {{"activations", blocks}, {"gradients", grads}};
           }}));
}
