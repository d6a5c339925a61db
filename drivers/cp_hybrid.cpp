// cp_hybrid: one forward/backward step of the hybrid model under CP for each attention strategy,
// against cp=1 on the same padded batch: loss, logits gradient, every block's output and every
// parameter gradient; per-phase timings and bytes per communication op, written to HDF5.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "common.hpp"
#include "comm/process_grid.hpp"
#include "harness.hpp"
#include "overlap.hpp"
#include "device.hpp"
#include "hybrid_common.hpp"
#include "io/results.hpp"

using namespace hcp;

namespace {
const std::string kDeck = "# Built-in deck of cp_hybrid: a small NemotronV3-style stack on a packed THD batch.\n" + drivers::builtin_model_deck(64) + R"([data]
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
check = true
)";

DeckSchema schema() {
  DeckSchema s;
  drivers::add_hybrid_model_keys(s, {"p2p", "allgather", "a2a", "all"}, "all");
  drivers::add_cp_driver_keys(s, "120, 37, 90", 128);
  drivers::add_device_key(s);
  return s;
}

std::vector<cp::AttnStrategy> strategies(const Deck& d) {
  const std::string a = d.get_string("parallel.attention");
  if (a != "all") return {cp::attn_strategy_from_string(a)};
  return {cp::AttnStrategy::P2P, cp::AttnStrategy::AllGather, cp::AttnStrategy::A2A};
}

void validate(DriverContext& ctx) {
  drivers::init_device(ctx.deck);
  const int cp = drivers::cp_size_of(ctx.deck, ctx.world->size());
  ProcessGrid g = ProcessGrid::make(*ctx.world, cp);
  for (auto st : strategies(ctx.deck)) {
    const model::HybridConfig c = drivers::hybrid_config(ctx.deck, st);
    auto b = drivers::make_token_batch(ctx.deck, cp, c.vocab, 1);
    model::HybridModel m(*g.cp, c, b.layout);  // every layer's divisibility rules
  }
}

double rel_err(const Tensor& a, const Tensor& b) {
  ErrorStats e = compare(a, b);
  return e.max_abs / std::max(e.ref_max, 1e-300);
}

void run(DriverContext& ctx) {
  const Deck& d = ctx.deck;
  const int cp = drivers::cp_size_of(d, ctx.world->size());
  ProcessGrid grid = ProcessGrid::make(*ctx.world, cp);
  std::unique_ptr<Communicator> nccl;
  Communicator& cpc = drivers::device_comm(d, *grid.cp, nccl);
  auto self = ctx.world->split(ctx.world->rank(), 0);
  const Space space = drivers::space_of(d);
  const int r = grid.cp_rank;
  const DType dt = dtype_from_string(d.get_string("data.dtype"));
  const auto seed = static_cast<std::uint64_t>(d.get_int("data.seed"));
  const bool check = d.get_bool("run.check");
  const int warm = static_cast<int>(d.get_int("run.warmup")), reps = static_cast<int>(d.get_int("run.repeats"));
  const double tol = dt == DType::F64 ? 1e-10 : 2e-4;
  const auto sts = strategies(d);
  const model::HybridConfig c0 = drivers::hybrid_config(d, sts[0]);
  const drivers::TokenBatch batch = drivers::make_token_batch(d, cp, c0.vocab, seed);
  model::ParamMap p = model::hybrid_init(c0, dt, seed);
  if (space == Space::Cuda)
    for (auto& [n, t] : p) t = t.to(Space::Cuda);  // the model runs where its parameters live
  auto host = [](const Tensor& t) { return t.space() == Space::Host ? t : t.to(Space::Host); };
  const auto tok = drivers::local_ids(batch.tokens, batch.layout, cp, r);
  const auto lab = drivers::local_ids(batch.labels, batch.layout, cp, r);

  std::unique_ptr<ResultsWriter> w;
  if (!ctx.out.empty()) w = std::make_unique<ResultsWriter>(ctx.out, *ctx.world);
  // cp=1 reference on rank 0 (the attention strategy is irrelevant there).
  model::StepResult ref;
  model::ParamMap rg;
  std::vector<Tensor> ref_blocks;
  Tensor ref_dlogits;
  double ref_ms = 0;
  if (check && ctx.root()) {
    model::HybridModel m(*self, c0, batch.layout);
    const double t0 = MPI_Wtime();
    ref = m.step(p, batch.tokens, batch.labels, rg);
    ref_ms = (MPI_Wtime() - t0) * 1e3;
    for (auto& b : m.block_outputs()) ref_blocks.push_back(host(b));
    ref_dlogits = host(m.dlogits());
    for (auto& [n, t] : rg) t = host(t);
  }
  if (check && w) {
    for (std::size_t i = 0; i < c0.pattern.size(); ++i)
      w->tensor("/activations/reference/block_" + std::to_string(i), ctx.root() ? ref_blocks[i] : Tensor(),
                "[T,hidden] global order", "1");
    w->tensor("/gradients/reference/logits", ctx.root() ? ref_dlogits : Tensor(), "[T,vocab] global order", "1/token");
    for (auto& [n, t] : p) w->tensor("/gradients/reference/" + n, ctx.root() ? rg.at(n) : Tensor(), "parameter shape", "1");
  }
  struct Row {
    std::string name;
    double loss = 0, worst = 0, step_ms = 0, comm_mb = 0, overlap = -1;  // overlap < 0: no ring exchanges
    std::map<std::string, double> phases;
  };
  std::vector<Row> rows;
  bool all_pass = true;
  for (auto st : sts) {
    const std::string name = cp::to_string(st);
    const model::HybridConfig c = drivers::hybrid_config(d, st);
    model::HybridModel m(cpc, c, batch.layout);
    model::ParamMap grads;
    model::StepResult res;
    std::vector<double> step_ms, ring_ms;
    std::map<std::string, std::vector<double>> phase_ms;
    for (int it = 0; it < warm + reps; ++it) {
      if (it == warm) cpc.reset_counters();
      m.reset_phases();
      cpc.barrier();
      const double rw0 = drivers::ring_wait_seconds(cpc);
      const double t0 = MPI_Wtime();
      res = m.step(p, tok, lab, grads);
      const double t1 = MPI_Wtime();
      if (it >= warm) {
        step_ms.push_back((t1 - t0) * 1e3);
        ring_ms.push_back((drivers::ring_wait_seconds(cpc) - rw0) * 1e3);
        for (auto& [ph, ms] : m.phase_ms()) phase_ms[ph].push_back(ms);
      }
    }
    Row row;
    row.name = name;
    row.loss = res.loss;
    row.step_ms = cpc.all_reduce_scalar(drivers::median(step_ms), ReduceOp::Max);
    for (auto& [ph, v] : phase_ms) row.phases[ph] = cpc.all_reduce_scalar(drivers::median(v), ReduceOp::Max);
    std::int64_t bytes = 0;
    for (auto& [op, cc] : cpc.counters()) bytes += cc.bytes_sent / reps;
    row.comm_mb = cpc.all_reduce_scalar(static_cast<double>(bytes), ReduceOp::Max) / 1e6;
    std::vector<Tensor> blocks;
    for (auto& b : m.block_outputs()) blocks.push_back(host(cp::dcs_gather(cpc, b, batch.layout)));
    Tensor dlogits = host(cp::dcs_gather(cpc, m.dlogits(), batch.layout));
    for (auto& [n, t] : grads) t = host(t);
    std::vector<std::pair<std::string, double>> errs;
    if (check && ctx.root()) {
      errs.push_back({"loss", std::abs(res.loss - ref.loss) / std::max(std::abs(ref.loss), 1e-300)});
      errs.push_back({"logits_grad", rel_err(dlogits, ref_dlogits)});
      for (std::size_t i = 0; i < blocks.size(); ++i) errs.push_back({"block_" + std::to_string(i), rel_err(blocks[i], ref_blocks[i])});
      for (auto& [n, t] : rg) errs.push_back({"d" + n, rel_err(grads.at(n), t)});
      for (auto& e : errs) row.worst = std::max(row.worst, e.second);
    }
    double pass = !check || row.worst <= tol ? 1 : 0;
    ctx.world->broadcast(&pass, 1, DType::F64, 0);
    all_pass = all_pass && pass == 1;
    if (w) {
      w->comm(cpc, name + "/");
      for (std::size_t i = 0; i < blocks.size(); ++i)
        w->tensor("/activations/" + name + "/block_" + std::to_string(i), blocks[i], "[T,hidden] global order", "1");
      w->tensor("/gradients/" + name + "/logits", dlogits, "[T,vocab] global order", "1/token");
      for (auto& [n, t] : grads) w->tensor("/gradients/" + name + "/" + n, t, "parameter shape", "1");
      w->timings(name + "/step", step_ms);
      for (auto& [ph, v] : phase_ms) w->timings(name + "/" + ph, v);
      for (auto& [n, e] : errs) w->summary(name + "/" + n, e, e, tol, e <= tol);
    }
    const drivers::Overlap ov = drivers::measure_overlap(cpc, ring_ms, reps, space);  // after w->comm
    if (ov.ring) {
      row.overlap = ov.fraction;
      if (w) {
        w->timings(name + "/ring_exposed", ov.exposed_ms);
        w->timings(name + "/ring_isolated", ov.isolated_ms);
      }
    }
    rows.push_back(row);
  }
  if (w) {
    std::string names;
    for (auto& rw : rows) names += (names.empty() ? "" : ",") + rw.name;
    w->config({{"driver", "cp_hybrid"}, {"deck", d.text()}, {"deck_resolved", d.resolved()}, {"command_line", ctx.cmdline},
               {"git_revision", ctx.git_rev}, {"format", d.get_string("data.format")}, {"strategy", names},
               {"mamba_cp", d.get_string("parallel.mamba_cp")}, {"pattern", c0.pattern},
               {"backend", drivers::device_desc(d, cpc)}, {"dtype", to_string(dt)}});
    w->config_int("cp_size", cp);
    w->config_int("world_size", ctx.world->size());
    w->config_int("tokens", batch.layout.total());
    w->finish();
  }
  if (ctx.root()) {
    std::printf("# cp_hybrid: ranks=%d cp=%d pattern=%s format=%s tokens=%lld (%lld sequences, %lld label tokens) "
                "hidden=%lld vocab=%lld mamba_cp=%s dtype=%s backend=%s\n",
                ctx.world->size(), cp, c0.pattern.c_str(), d.get_string("data.format").c_str(),
                static_cast<long long>(batch.layout.total()), static_cast<long long>(batch.layout.nseq()),
                static_cast<long long>(batch.label_tokens), static_cast<long long>(c0.hidden),
                static_cast<long long>(c0.vocab), d.get_string("parallel.mamba_cp").c_str(), to_string(dt).c_str(),
                drivers::device_desc(d, cpc).c_str());
    if (check) std::printf("# cp=1 reference on rank 0: loss %.12f, step %.2f ms\n", ref.loss, ref_ms);
    std::printf("# %-10s %16s %10s %12s %8s %12s  %s\n", "attention", "loss", "step_ms", "comm_MB/rank", "overlap",
                "max_rel_err", "phases (ms, median, slowest rank)");
    for (auto& rw : rows) {
      std::printf("  %-10s %16.12f %10.2f %12.3f %8s %12.1e ", rw.name.c_str(), rw.loss, rw.step_ms, rw.comm_mb,
                  rw.overlap < 0 ? "-" : drivers::fmt_fraction(rw.overlap).c_str(), rw.worst);
      for (auto& [ph, ms] : rw.phases) std::printf(" %s=%.1f", ph.c_str(), ms);
      std::printf("\n");
    }
    std::printf("RESULT cp_hybrid %s%s%s\n", all_pass ? (check ? "PASS" : "UNCHECKED") : "FAIL",
                ctx.out.empty() ? "" : " file=", ctx.out.c_str());
  }
  if (!all_pass) throw Error("CP result differs from the cp=1 reference beyond tolerance");
}
}  // namespace

int main(int argc, char** argv) {
  DriverSpec spec;
  spec.name = "cp_hybrid";
  spec.description = "hybrid Mamba2 + attention + MoE model, one step under CP for each attention strategy, against cp=1";
  spec.schema = schema();
  spec.builtin_deck = kDeck;
  spec.default_out = "cp_hybrid.h5";
  spec.validate = validate;
  spec.run = run;
  return run_driver(argc, argv, spec);
}
