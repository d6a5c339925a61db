// train_hybrid: trains the hybrid model under CP on a deterministic synthetic corpus (packed THD
// sequences of varying length, or BSHD rows) with AdamW, warm-up + cosine schedule and gradient
// clipping. Optionally trains a cp=1 replica on rank 0 in lock step and checks that the two loss
// curves agree step by step. Checkpoints (HDF5: parameters, Adam moments, step) and resume
// reproduce the uninterrupted run bit for bit. One progress line per step.

#include <filesystem>
#include <fstream>
#include <utility>

#include "cases.hpp"
#include "common.hpp"
#include "device.hpp"
#include "hybrid_common.hpp"
#include "memory_admission.hpp"
#include "trainer.hpp"

using namespace hcp;

namespace {
const std::string kDeck = "# Built-in deck of train_hybrid: a small hybrid stack on packed synthetic sequences.\n" +
                          drivers::builtin_model_deck(32) + R"([data]
format = "thd"
seqs_per_step = 4
min_len = 24
max_len = 72
dtype = "fp64"
seed = 1

[train]
steps = 30
lr = 1e-2
min_lr = 1e-3
warmup = 5
reference = true     # cp=1 replica on rank 0, loss curves compared step by step
loss_rtol = 0.0      # 0: 1e-9 in fp64, 1e-5 in fp32 (bf16: 5e-2), while the expert choices agree
loss_rtol_flipped = 0.0  # 0: 1e-2 (bf16: 5e-2), from the first step whose expert choices differ
)";

DeckSchema schema() {
  DeckSchema s;
  drivers::add_hybrid_model_keys(s, drivers::attention_choices(false), "p2p");
  s.add_string("data.format", "thd", "token layout", {"bshd", "thd"})
      .add_int("data.seqs_per_step", 4, "sequences per step (THD packed) or batch rows (BSHD)", 1)
      .add_int("data.min_len", 24, "shortest sequence (THD)", 2)
      .add_int("data.max_len", 72, "longest sequence (THD; BSHD row length, a multiple of 2*cp)", 2)
      .add_string("data.dtype", "fp64",
                  "precision of compute (bf16: bf16 parameters and activations from fp32 master weights; fp32 "
                  "AdamW moments and update, fp32 router)",
                  {"fp32", "fp64", "bf16"})
      .add_int("data.seed", 1, "seed of the corpus and the initial parameters", 0)
      .add_int("parallel.cp_size", 0, "CP group size (0: world size)", 0)
      .add_bool("train.reference", true, "train a cp=1 replica on rank 0 and compare the loss curves")
      .add_float("train.loss_rtol", 0.0,
                 "largest allowed |loss_cp - loss_cp1| / loss_cp1 per step while every token's expert choice agrees "
                 "with the replica's (0: 1e-9 fp64, 1e-5 fp32, 5e-2 bf16)",
                 0.0)
      .add_float("train.loss_rtol_flipped", 0.0,
                 "the same from the first step where a top-k choice differs from the replica's (a near-tie the "
                 "dtype's rounding decides; the runs then train slightly different models) (0: 1e-2, bf16 5e-2)",
                 0.0)
      .add_int("train.checkpoint_every", 0, "write a checkpoint every N steps (0: never)", 0)
      .add_string("train.checkpoint", "checkpoint.h5", "checkpoint file")
      .add_string("train.resume", "", "checkpoint to resume from (\"\": start fresh)")
      .add_int("train.stop_after", 0, "stop (with a checkpoint) after this many steps of this run (0: run to the end)",
               0);
  drivers::add_adamw_keys(s);
  drivers::add_device_key(s);
  drivers::add_memory_keys(s);
  drivers::add_partition_keys(s);
  return s;
}

void validate(DriverContext& ctx) {
  const Deck& d = ctx.deck;
  const drivers::MemoryLimit lim = drivers::device_and_limit(ctx);
  drivers::TrainSetup s = drivers::train_setup(ctx);
  const auto at_cp = [&](int k) { return drivers::train_memory(d, s.cfg, k, drivers::ep_size_of(d, s.cfg, k)); };
  const MemoryModel model = at_cp(s.cp);
  // A run refuses sizes that cannot fit here; a dry run reports them (below) and, arithmetic only,
  // lays out no tokens for them. Every other rule is the same for both.
  if (!ctx.dry_run && drivers::admit(d, model, lim, s.cp, at_cp, ctx.root())) ctx.memory_warned = model.keys();
  const bool dry_too_big = ctx.dry_run && static_cast<double>(model.peak()) > lim.bytes;
  const std::string resume = ctx.deck.get_string("train.resume");
  if (!resume.empty())
    HCP_INPUT_CHECK(std::filesystem::is_regular_file(resume) && std::ifstream(resume).good(), d.where("train.resume"),
                    "train.resume: cannot read checkpoint file '", resume, "' (not a readable file)");
  bool first = true;
  drivers::for_cp_groups(ctx, s.cp, [&](Communicator& cp) {
    if (!dry_too_big) {
      const drivers::PlacedBatch pb = drivers::placed_step(d, s, cp.rank(), 1);
      try {
        model::HybridModel m(cp, s.cfg, pb.placement);
      } catch (const Error& e) {  // a layer's shape rule: name where the strategies came from
        throw Error(drivers::from_input(d.where("parallel.attention"), e.what()));
      }
    }
    if (!resume.empty() && std::exchange(first, false)) {
      const ExpertGroups eg(cp, drivers::ep_size_of(d, s.cfg, s.cp));
      std::vector<std::string> names;
      for (const auto& [n, t] : model::hybrid_init(s.cfg, DType::F32, 0, &eg)) names.push_back(n);
      drivers::check_resume(resume, schema(), ctx.deck, names, ctx.world->rank(), ctx.world->size());  // whole file
    }
  });
  if (d.get_int("train.checkpoint_every") > 0 || d.get_int("train.stop_after") > 0)
    check_output_path(d.get_string("train.checkpoint"), d.where("train.checkpoint") + ": train.checkpoint = \"" +
                                                            d.get_string("train.checkpoint") + "\"");
  if (ctx.dry_run && ctx.root()) drivers::print_memory(model, lim, s.cp, ctx.world_size(), ctx.driver, at_cp);
}

void run(DriverContext& ctx) {
  drivers::Trainer tr(ctx);
  tr.header();
  for (std::int64_t t = tr.start() + 1; t <= tr.steps(); ++t)
    if (!tr.step(t)) break;
  tr.finish();
}
}  // namespace

int main(int argc, char** argv) {
  return run_driver(argc, argv,
                    {"train_hybrid",
                     "train the hybrid model under CP (AdamW, schedule, clipping, checkpoints) against a cp=1 replica",
                     schema(),
                     kDeck,
                     "train_hybrid.h5",
                     validate,
                     run,
                     {}});
}
