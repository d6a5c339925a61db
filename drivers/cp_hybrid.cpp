// cp_hybrid: one forward/backward step of the hybrid model under CP for each attention strategy,
// against cp=1 on the same padded batch: loss, logits gradient, every block's output and every
// parameter gradient; per-phase timings and bytes per communication op, written to HDF5.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common.hpp"
#include "device.hpp"
#include "hybrid_common.hpp"
#include "study.hpp"

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
          [](const Deck& d, Communicator& c, int cp, const std::string& n) {
            const model::HybridConfig h = drivers::hybrid_config(d, n, cp);
            drivers::ep_size_of(d, h, cp);
            const drivers::PlacedBatch pb = drivers::placed_batch(d, cp, c.rank(), h, 1);
            model::HybridModel m(c, h, pb.batch.layout, nullptr, pb.docs);
          },
          [](const Deck& d, int cp, const std::string& n) {
            const model::HybridConfig h = drivers::hybrid_config(d, n, cp);
            return drivers::hybrid_memory(d, h, cp, drivers::ep_size_of(d, h, cp));
          },
          [](const Deck& d, int cp) {
            const model::HybridConfig h = drivers::hybrid_config(d, "p2p", cp);
            const SeqLayout g = drivers::global_layout(d, cp);
            const DType dt = dtype_from_string(d.get_string("data.dtype"));
            const auto docs = drivers::doc_partition(d, cp, drivers::hybrid_doc_cost(h));
            drivers::LayerBytes b;
            if (h.pattern.find('*') != std::string::npos)
              drivers::add_attention_bytes(b, model::cp_attn_config(h.attn, g, docs), cp, dt);
            if (h.pattern.find('M') != std::string::npos) drivers::add_mamba_bytes(b, h.mamba, g, docs.get(), cp, dt);
            drivers::add_placement(b, d, cp, drivers::hybrid_doc_cost(h));
            if (h.pattern.find('E') != std::string::npos)
              drivers::add_moe_bytes(b, h.moe, h.hidden, g.total() / cp, cp, drivers::ep_size_of(d, h, cp), dt);
            return b;
          }};
}

// A top-k choice may flip between a CP run and cp=1 where two experts' scores differ by less than
// the rounding of the run's dtype (bf16: a few in a thousand); more flips than this is a fault.
constexpr double kMaxFlips = 0.05;
// bf16 tensors are compared norm-wise within Study::tol (0.1: a flipped choice moves the gradients
// of its experts, and through them every earlier block's); the loss, a mean over every token, must
// agree far closer.
constexpr double kBf16LossTol = 2e-3;

// Fraction of (real token, MoE block) pairs whose chosen expert set differs from cp=1's (rank 0;
// 0 elsewhere and without a check). Collective.
double routing_flips(drivers::Study& st, const model::HybridModel& m, const std::vector<Tensor>& ref,
                     const SeqLayout& global) {
  if (!st.check) return 0.0;
  return drivers::routing_flips(st.comm, st.space, m.routing(), ref, global, st.root(), st.docs.get());
}

void run(DriverContext& ctx) {
  drivers::Study st(ctx, "cp_hybrid", drivers::model_tolerance);
  st.norm_wise = st.dt == DType::BF16;
  const Deck& d = st.deck;
  std::vector<std::pair<std::string, std::string>> skipped;
  const std::vector<std::string> names = st.cases(cases(), &skipped);
  const int r = st.grid.cp_rank;
  const auto seed = static_cast<std::uint64_t>(d.get_int("data.seed"));
  const model::HybridConfig c0 = drivers::hybrid_config(d, names.front(), st.cp);
  const drivers::PlacedBatch placed = drivers::placed_batch(d, st.cp, r, c0, seed);
  const drivers::TokenBatch& batch = placed.batch;
  st.docs = placed.docs;
  // Every rank holds its own experts only; the cp=1 reference (rank 0) holds them all.
  const ExpertGroups groups(st.comm, drivers::ep_size_of(d, c0, st.cp));
  const model::ShardMap shards = model::expert_shards(c0, groups);
  const model::ParamMap p = drivers::in_space(model::hybrid_init(c0, st.dt, seed, &groups), st.space);
  model::HybridConfig c1 = c0;
  c1.ep = 1;
  const bool owner = groups.replicas().rank() == 0 && st.grid.dp_rank == 0;  // writes its experts' rows
  const std::vector<std::int64_t>& tok = placed.tokens;
  const std::vector<std::int64_t>& lab = placed.labels;
  // The unpadded batch: token ids and labels of the real tokens in global order (the cp=1 reference's
  // input, and /inputs).
  std::vector<std::int64_t> rtok, rlab;
  for (const std::int64_t i : cp::real_rows(batch.layout)) {
    rtok.push_back(batch.tokens[static_cast<std::size_t>(i)]);
    rlab.push_back(batch.labels[static_cast<std::size_t>(i)]);
  }

  // cp=1 reference on rank 0 (the attention strategy is irrelevant there), on the unpadded batch:
  // every sequence at its real length.
  model::StepResult ref;
  model::ParamMap rg;
  std::vector<Tensor> ref_blocks, ref_routing;
  Tensor ref_dlogits;
  if (st.check && st.root()) {
    model::HybridModel m(st.self, c1, batch.layout.unpadded());
    ref = m.step(drivers::in_space(model::hybrid_init(c1, st.dt, seed), st.space), rtok, rlab, rg);
    for (auto& b : m.block_outputs()) ref_blocks.push_back(drivers::host(b));
    ref_routing = m.routing();
    ref_dlogits = drivers::host(m.dlogits());
    for (auto& [n, t] : rg) t = drivers::host(t);
  }
  std::map<std::string, std::string> cfg = {{"format", d.get_string("data.format")},
                                            {"strategy", drivers::join(names)},
                                            {"mamba_cp", d.get_string("parallel.mamba_cp")},
                                            {"pattern", c0.pattern}};
  // One case: the strategy of each attention layer (with "all", each case uses its one strategy everywhere).
  if (names.size() == 1) cfg["attention_layers"] = drivers::attention_layers(c0);
  cfg["partition"] = d.get_string("data.partition");
  st.config(cfg, skipped);
  if (st.out()) {
    st.out()->config_int("tokens", batch.layout.total());
    if (st.check) {
      for (std::size_t i = 0; i < c0.pattern.size(); ++i)
        st.out()->tensor("/activations/reference/block_" + std::to_string(i), st.root() ? ref_blocks[i] : Tensor(),
                         "[T,hidden] real tokens, global order", "1");
      st.out()->tensor("/gradients/reference/logits", ref_dlogits, "[T,vocab] real tokens, global order", "1/token");
      for (auto& [n, t] : p)
        st.out()->tensor("/gradients/reference/" + n, st.root() ? rg.at(n) : Tensor(), "parameter shape", "1");
    }
  }
  if (st.keeps_inputs()) {  // run.save = inputs: token ids and labels (real tokens, global order), parameters
    st.input_layout(batch.layout);
    const auto as_tensor = [](const std::vector<std::int64_t>& v) {
      return Tensor::from(std::vector<double>(v.begin(), v.end()), {static_cast<std::int64_t>(v.size())}, DType::F64);
    };
    st.input_whole("tokens", as_tensor(rtok), "[T] token ids, real tokens, global order", "id");
    st.input_whole("labels", as_tensor(rlab), "[T] label ids (-100: no label), real tokens, global order", "id");
    model::ParamMap ph;
    for (const auto& [n, t] : p) ph[n] = drivers::host(t);
    drivers::write_params(*st.out(), *st.ctx.world, "/inputs/params/", ph, shards, owner, "parameter shape");
  }
  st.header(drivers::fields("pattern", c0.pattern, "format", d.get_string("data.format"), "tokens",
                            batch.layout.total(), "sequences", batch.layout.nseq(), "label_tokens", batch.label_tokens,
                            "hidden", c0.hidden, "vocab", c0.vocab, "mamba_cp", d.get_string("parallel.mamba_cp")),
            skipped);
  st.record_placement(drivers::hybrid_doc_cost(c0));
  if (st.check && st.root()) std::printf("# cp=1 reference on rank 0: loss %.12f\n", ref.loss);
  // Parameters this rank holds (the routed experts' 1/ep), as counted from the sizes.
  const model::ParamCount pc = model::param_count(c0, groups.size());
  std::int64_t held = 0;
  for (const auto& [n, t] : p) held += t.numel();
  HCP_CHECK(held == pc.total, "cp_hybrid: this rank holds ", held, " parameter elements, the count says ", pc.total);
  st.write_parameter_memory(static_cast<double>(held), static_cast<double>(pc.experts), groups.size());
  drivers::Table table({{"attention", 10},
                        {"loss", 16},
                        {"step_ms", 10},
                        {"comm_MB/rank", 12},
                        {"overlap", 8},
                        {st.norm_wise ? "l2_rel_err" : "max_rel_err", 12},
                        {"flips", 7},
                        {" phases (ms, median, slowest rank)", 0}});
  bool all_pass = true;
  for (const std::string& name : names) {
    st.begin_case(name);
    model::HybridModel m(st.comm, drivers::hybrid_config(d, name, st.cp), batch.layout, &groups, placed.docs);
    model::ParamMap grads;
    model::StepResult res;
    const drivers::Samples s = st.time(
        [&](PhaseTimes& c) {
          grads.clear();  // the last step's gradients are spent (an optimizer step would take them)
          res = m.step(p, tok, lab, grads);
          c.lap("step");
          for (auto& [ph, ms] : m.phase_ms()) c.add(ph, ms);
        },
        [&] { m.reset_phases(); });
    const double comm_mb = st.comm.all_reduce_scalar(static_cast<double>(st.bytes_per_step()), ReduceOp::Max) / 1e6;
    model::ParamMap whole;  // the experts' gradients gathered over each EP group, for the check
    if (st.check) whole = drivers::gather_shards(groups, shards, grads);
    for (auto& [n, t] : grads) t = drivers::host(t);
    // Real rows against the unpadded oracle; the logits gradient of a pad is zero (the residual
    // stream of a pad is not: its blocks' outputs are left unchecked).
    drivers::Study::Errors e;
    const double loss_err = std::abs(res.loss - ref.loss) / std::max(std::abs(ref.loss), 1e-300);
    if (st.check && st.root()) e.add("loss", loss_err);
    st.result(e, "logits_grad", "/gradients/" + name + "/logits", m.dlogits(), ref_dlogits, batch.layout, true,
              "[T,vocab] real tokens, global order", "1/token");
    for (std::size_t i = 0; i < m.block_outputs().size(); ++i)
      st.result(e, "block_" + std::to_string(i), "/activations/" + name + "/block_" + std::to_string(i),
                m.block_outputs()[i], st.check && st.root() ? ref_blocks[i] : Tensor(), batch.layout, false,
                "[T,hidden] real tokens, global order", "1");
    if (st.check && st.root())
      for (auto& [n, t] : rg) st.compare(e, "d" + n, drivers::host(whole.at(n)), t);
    st.cross_scalar(e, "loss", res.loss);
    for (auto& [n, t] : grads) st.cross_compare(e, "d" + n, t);  // each rank its experts' rows
    const double flips = routing_flips(st, m, ref_routing, batch.layout);
    const bool loss_ok = !st.check || !st.root() || loss_err <= std::min(st.tol, kBf16LossTol);
    all_pass = st.verdict(name, e, flips <= kMaxFlips && loss_ok) && all_pass;
    if (st.out() && st.check) st.out()->attribute("/summary/" + name, "routing_flips", drivers::fmt("%.6f", flips));
    if (st.out()) {
      drivers::write_params(*st.out(), *st.ctx.world, "/gradients/" + name + "/", grads, shards, owner,
                            "parameter shape");
    }
    st.phase_memory(m.phase_peaks());
    st.write_timings(name, s);
    const double ov = st.overlap(name, s);
    std::string phases;
    for (auto& [ph, v] : s)
      if (ph != "step" && ph != "ring_wait") phases += " " + ph + "=" + drivers::fmt("%.1f", st.slowest(v));
    table.row({name, drivers::fmt("%16.12f", res.loss), drivers::fmt("%.2f", st.slowest(s.at("step"))),
               drivers::fmt("%.3f", comm_mb),
               ov < 0           ? "-"
               : std::isnan(ov) ? "n/a"
                                : drivers::fmt("%.2f", ov),
               st.check || st.cross ? drivers::fmt("%.1e", e.worst) : std::string("unchecked"),
               st.check ? drivers::fmt("%.4f", flips) : "-", phases});
  }
  if (st.root()) table.print();
  st.finish(all_pass,
            "a CP result differs beyond tolerance from what run.check compares it with (the cp=1 reference or the "
            "first case)");
}
}  // namespace

int main(int argc, char** argv) {
  const DriverSpec spec{
      "cp_hybrid",
      "hybrid Mamba2 + attention + MoE model, one step under CP for each attention strategy, against cp=1",
      schema(),
      kDeck,
      "cp_hybrid.h5",
      [](DriverContext& c) { drivers::validate_cases(c, cases()); },
      run,
      [](const Deck& d) {
        const model::HybridConfig h = drivers::hybrid_config(d, "p2p", 1);
        std::vector<std::string> blocks, grads = model::hybrid_param_names(h);
        for (std::size_t i = 0; i < h.pattern.size(); ++i) blocks.push_back("block_" + std::to_string(i));
        grads.push_back("logits");
        return drivers::case_tensors(cases(), d, {{"activations", blocks}, {"gradients", grads}});
      }};
  return run_driver(argc, argv, spec);
}
