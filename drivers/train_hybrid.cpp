// train_hybrid: trains the hybrid model under CP on a deterministic synthetic corpus (packed THD
// sequences of varying length, or BSHD rows) with AdamW, warm-up + cosine schedule and gradient
// clipping. Optionally trains a cp=1 replica on rank 0 in lock step and checks that the two loss
// curves agree step by step. Checkpoints (HDF5: parameters, Adam moments, step) and resume
// reproduce the uninterrupted run bit for bit. One progress line per step.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <utility>

#include "cases.hpp"
#include "common.hpp"
#include "core/clock.hpp"
#include "device.hpp"
#include "hybrid_common.hpp"
#include "memory_admission.hpp"
#include "study.hpp"
#include "train_io.hpp"
#include "train_replica.hpp"

using namespace hcp;

namespace {
// From the first flipped expert choice the CP run and the replica train slightly different models:
// fp32 runs of inputs/hybrid_nano_like.toml at np 2 stay within 2e-6 until a flip at step 21, then
// drift to 9.7e-4 by step 27.
constexpr double kLossRtolFlipped = 1e-2;
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

struct Setup {
  int cp = 1;
  DType dt = DType::F64;
  model::HybridConfig cfg;
  model::AdamWConfig opt;
};

// The batch of step t as data.partition lays it out, and this rank's tokens.
drivers::PlacedBatch placed_step(const Deck& d, const Setup& s, int rank, std::int64_t t) {
  return drivers::place_batch(d, drivers::step_batch(d, drivers::by_documents(d) ? 1 : s.cp, s.cfg.vocab, t), s.cp,
                              rank, s.cfg);
}

Setup make_setup(const DriverContext& ctx) {
  const Deck& d = ctx.deck;
  Setup s;
  s.cp = drivers::cp_size_of(d, ctx.world_size());
  s.dt = dtype_from_string(d.get_string("data.dtype"));
  s.cfg = drivers::hybrid_config(d, d.get_string("parallel.attention"), s.cp);
  s.opt = drivers::adamw_from_deck(d);
  if (d.get_string("data.format") == "bshd")  // BSHD rows are max_len long; min_len is a THD key
    HCP_INPUT_CHECK(s.cp == 1 || d.get_int("data.max_len") % (2 * s.cp) == 0, d.where("data.max_len"),
                    "data.max_len = ", d.get_int("data.max_len"),
                    " (the BSHD row length) must be a multiple of 2*cp = ", 2 * s.cp);
  else
    HCP_INPUT_CHECK(d.get_int("data.min_len") <= d.get_int("data.max_len"), d.where("data.min_len"), "data.min_len (",
                    d.get_int("data.min_len"), ") must be <= data.max_len (", d.get_int("data.max_len"), ")");
  return s;
}

void validate(DriverContext& ctx) {
  const Deck& d = ctx.deck;
  const drivers::MemoryLimit lim = drivers::device_and_limit(ctx);
  Setup s = make_setup(ctx);
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
      const drivers::PlacedBatch pb = placed_step(d, s, cp.rank(), 1);
      try {
        model::HybridModel m(cp, s.cfg, pb.batch.layout, nullptr, pb.docs);
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
  const Deck& d = ctx.deck;
  Setup s = make_setup(ctx);
  ProcessGrid grid = ProcessGrid::make(*ctx.world, s.cp);
  std::unique_ptr<Communicator> nccl;
  Communicator& cpc = drivers::device_comm(d, *grid.cp, nccl);
  const int r = grid.cp_rank;
  const bool with_ref = d.get_bool("train.reference");
  const double rtol =
      d.get_float("train.loss_rtol") > 0 ? d.get_float("train.loss_rtol") : drivers::train_loss_tolerance(s.dt);
  const double rtol_flipped = d.get_float("train.loss_rtol_flipped") > 0 ? d.get_float("train.loss_rtol_flipped")
                                                                         : std::max(rtol, kLossRtolFlipped);
  const std::int64_t steps = d.get_int("train.steps"), every = d.get_int("train.checkpoint_every"),
                     stop_after = d.get_int("train.stop_after");
  const std::string ck = d.get_string("train.checkpoint"), resume = d.get_string("train.resume");
  // Master weights, AdamW moments and the update in mw.master; the model steps in s.dt.
  const drivers::MasterWeights mw(s.dt);
  // Each rank holds its EP rank's experts (parameters, gradients, moments); the replica all of them.
  const ExpertGroups groups(cpc, drivers::ep_size_of(d, s.cfg, s.cp));
  const model::ShardMap shards = model::expert_shards(s.cfg, groups);
  const bool owner = groups.replicas().rank() == 0 && grid.dp_rank == 0;  // writes its experts' rows
  const auto seed = static_cast<std::uint64_t>(d.get_int("data.seed"));
  // Model, gradients and optimizer state live on run.device.
  model::ParamMap p = drivers::in_space(model::hybrid_init(s.cfg, mw.master, seed, &groups), drivers::space_of(d));
  model::AdamW opt(s.opt, p);
  std::set<std::string> split;
  for (const auto& [n, sh] : shards) split.insert(n);
  opt.set_split(split, &groups.ep());
  drivers::TrainSeries ts;
  std::vector<double>& loss = ts.loss;
  std::vector<double>& ref_loss = ts.loss_reference;
  if (!resume.empty()) drivers::read_checkpoint(resume, p, opt, loss, with_ref ? &ref_loss : nullptr, shards);
  std::unique_ptr<drivers::Replica> replica;  // rank 0
  if (with_ref && ctx.root())
    replica = std::make_unique<drivers::Replica>(*grid.self, s.cfg, mw, s.opt, seed, drivers::space_of(d), resume);
  const std::int64_t start = opt.steps_done();
  HCP_CHECK(start < steps, "train.resume: the checkpoint is at step ", start, ", not before train.steps = ", steps);
  if (ctx.root())
    std::printf(
        "# train_hybrid: %s\n",
        drivers::fields("ranks", ctx.world->size(), "cp", s.cp, "pattern", s.cfg.pattern, "hidden", s.cfg.hidden,
                        "vocab", s.cfg.vocab, "ep", groups.size(), "attention", d.get_string("parallel.attention"),
                        "mamba_cp", d.get_string("parallel.mamba_cp"), "dtype", to_string(s.dt), "steps",
                        std::to_string(start + 1) + ".." + std::to_string(steps), "backend",
                        drivers::device_desc(d, cpc), "resumed_from", resume.empty() ? "-" : resume)
            .c_str());
  double worst = 0;             // relative loss difference: the largest, in units of its step's tolerance
  std::int64_t first_flip = 0;  // the first step whose expert choices differ from the replica's (0: none)
  std::int64_t done_here = 0;
  for (std::int64_t t = start + 1; t <= steps; ++t) {
    const drivers::PlacedBatch pb = placed_step(d, s, r, t);
    const drivers::TokenBatch& b = pb.batch;
    model::HybridModel m(cpc, s.cfg, b.layout, &groups, pb.docs);
    model::ParamMap g;
    cpc.barrier();
    const double t0 = now_seconds();
    const model::StepResult res = m.step(mw.compute(p), pb.tokens, pb.labels, g);
    drivers::require_finite("the loss", res.loss, t);  // before the update (the same on every rank)
    mw.widen(g);
    const double gn = opt.step(p, g, model::is_buffer);
    drivers::require_finite("the gradient norm", gn, t);
    const double ms = cpc.all_reduce_scalar((now_seconds() - t0) * 1e3, ReduceOp::Max);
    loss.push_back(res.loss);
    ts.lr.push_back(opt.last_lr());
    ts.grad_norm.push_back(gn);
    ts.label_tokens.push_back(static_cast<double>(res.label_tokens));
    ts.step_ms.push_back(ms);
    double rl = 0, flips = 0;
    if (replica) {
      rl = replica->step(b);
      ref_loss.push_back(rl);
    }
    if (with_ref) {  // collective over the CP group; rank 0 compares with the replica
      const std::vector<Tensor> none;
      flips = drivers::routing_flips(cpc, drivers::space_of(d), m.routing(), replica ? replica->routing() : none,
                                     b.layout, ctx.root(), pb.docs.get());
      ts.routing_flips.push_back(flips);
      if (flips > 0 && first_flip == 0) first_flip = t;
    }
    if (replica) {
      const double rel = std::abs(res.loss - rl) / std::max(std::abs(rl), 1e-300);
      worst = nan_max(worst, rel / (first_flip > 0 ? rtol_flipped : rtol));
    }
    if (ctx.root()) {
      std::printf("step %4lld/%lld  loss %.6f", static_cast<long long>(t), static_cast<long long>(steps), res.loss);
      if (replica)
        std::printf("  cp1 %.6f (rel %.1e, flips %.1e)", rl, std::abs(res.loss - rl) / std::max(std::abs(rl), 1e-300),
                    flips);
      if (pb.docs)
        std::printf("  documents %lld whole %lld split",
                    static_cast<long long>(pb.docs->lens.size()) - static_cast<long long>(pb.docs->documents_split()),
                    static_cast<long long>(pb.docs->documents_split()));
      std::printf("  lr %.2e  gnorm %.3f  tokens/s %.0f  step %.1f ms\n", opt.last_lr(), gn,
                  static_cast<double>(b.layout.total()) / (ms * 1e-3), ms);
      std::fflush(stdout);
    }
    ++done_here;
    const bool stop = stop_after > 0 && done_here >= stop_after && t < steps;
    if ((every > 0 && t % every == 0) || stop || t == steps) drivers::require_finite(p, t);
    if ((every > 0 && t % every == 0) || stop)
      drivers::write_checkpoint(*ctx.world, ck, d, p, opt, loss, ref_loss, shards, owner);
    if (stop && ctx.root())
      std::printf("# stopped after %lld steps; checkpoint %s at step %lld\n", static_cast<long long>(done_here),
                  ck.c_str(), static_cast<long long>(t));
    if (stop) break;
  }
  double pass = !with_ref || worst <= 1 ? 1 : 0;
  ctx.world->broadcast(&pass, 1, DType::F64, 0);
  if (!ctx.out.empty()) {
    ResultsWriter w(ctx.out, *ctx.world);
    drivers::write_config(w, ctx, "train_hybrid", drivers::device_desc(d, cpc), s.dt, s.cp,
                          {{"format", d.get_string("data.format")},
                           {"strategy", d.get_string("parallel.attention")},
                           {"attention_layers", drivers::attention_layers(s.cfg)},
                           {"mamba_cp", d.get_string("parallel.mamba_cp")},
                           {"pattern", s.cfg.pattern},
                           {"resumed_from", resume}});
    drivers::write_train_results(w, *ctx.world, ts, p, shards, owner, with_ref, worst, rtol, pass == 1);
    w.finish();
  }
  if (ctx.root()) {
    const std::size_t n = loss.size();
    std::printf("# loss %.4f -> %.4f over %zu steps", loss.front(), loss.back(), n);
    if (with_ref && first_flip == 0)
      std::printf("; max |loss - cp1| / cp1 = %.1e (tolerance %.1e; expert choices agree)", worst * rtol, rtol);
    if (with_ref && first_flip > 0)
      std::printf(
          "; expert choices first differ at step %lld; |loss - cp1| / cp1 at most %.2f x its tolerance "
          "(%.1e before, %.1e from then)",
          static_cast<long long>(first_flip), worst, rtol, rtol_flipped);
    std::printf("\nRESULT train_hybrid %s%s%s\n", pass == 1 ? "PASS" : "FAIL",
                ctx.out.empty() ? "" : " file=", ctx.out.c_str());
  }
  if (pass != 1)
    throw CheckFailed(
        "the CP loss curve departs from the cp=1 replica beyond train.loss_rtol (train.loss_rtol_flipped once an "
        "expert choice differs)");
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
