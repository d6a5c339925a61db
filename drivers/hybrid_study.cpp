#include "hybrid_study.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common.hpp"

namespace hcp::drivers {
namespace {
// A top-k choice may flip between a CP run and cp=1 where two experts' scores differ by less than
// the rounding of the run's dtype (bf16: a few in a thousand); more flips than this is a fault.
constexpr double kMaxFlips = 0.05;
// bf16 tensors are compared norm-wise within Study::tol (0.1: a flipped choice moves the gradients
// of its experts, and through them every earlier block's); the loss, a mean over every token, must
// agree far closer.
constexpr double kBf16LossTol = 2e-3;

// Fraction of (real token, MoE block) pairs whose chosen expert set differs from cp=1's (rank 0;
// 0 elsewhere and without a check). Collective.
double routing_flips(Study& st, const model::HybridModel& m, const std::vector<Tensor>& ref) {
  if (!st.check) return 0.0;
  return drivers::routing_flips(st.comm, st.space, m.routing(), ref, st.placement, st.root());
}

}  // namespace

void HybridStudy::setup(const std::vector<std::string>& names, const drivers::Skipped& skipped) {
  Study& st = st_;
  const Deck& d = st.deck;
  seed_ = static_cast<std::uint64_t>(d.get_int("data.seed"));
  c0_ = drivers::hybrid_config(d, names.front(), st.cp);
  placed_ = drivers::placed_batch(d, st.cp, st.grid.cp_rank, c0_, seed_);
  st.placement = placed_.placement;
  // Every rank holds its own experts only; the cp=1 reference (rank 0) holds them all.
  groups_ = std::make_unique<ExpertGroups>(st.comm, drivers::ep_size_of(d, c0_, st.cp));
  shards_ = model::expert_shards(c0_, *groups_);
  p_ = drivers::in_space(model::hybrid_init(c0_, st.dt, seed_, groups_.get()), st.space);
  c1_ = c0_;
  c1_.ep = 1;
  owner_ = groups_->replicas().rank() == 0 && st.grid.dp_rank == 0;
  // The unpadded batch: token ids and labels of the real tokens in global order (the cp=1 reference's
  // input, and /inputs).
  const drivers::TokenBatch& batch = placed_.batch;
  for (const std::int64_t i : cp::real_rows(batch.layout)) {
    rtok_.push_back(batch.tokens[static_cast<std::size_t>(i)]);
    rlab_.push_back(batch.labels[static_cast<std::size_t>(i)]);
  }
  reference();
  records(names, skipped);
}

void HybridStudy::reference() {
  // The attention strategy is irrelevant at cp=1; every sequence at its real length.
  if (!st_.check || !st_.root()) return;
  model::HybridModel m(st_.self, c1_, placed_.batch.layout.unpadded());
  ref_ = m.step(drivers::in_space(model::hybrid_init(c1_, st_.dt, seed_), st_.space), rtok_, rlab_, rg_);
  for (auto& b : m.block_outputs()) ref_blocks_.push_back(drivers::host(b));
  ref_routing_ = m.routing();
  ref_dlogits_ = drivers::host(m.dlogits());
  for (auto& [n, t] : rg_) t = drivers::host(t);
}

void HybridStudy::records(const std::vector<std::string>& names, const drivers::Skipped& skipped) {
  Study& st = st_;
  const Deck& d = st.deck;
  const drivers::TokenBatch& batch = placed_.batch;
  std::map<std::string, std::string> cfg = {{"format", d.get_string("data.format")},
                                            {"strategy", drivers::join(names)},
                                            {"mamba_cp", d.get_string("parallel.mamba_cp")},
                                            {"pattern", c0_.pattern}};
  // One case: the strategy of each attention layer (with "all", each case uses its one strategy everywhere).
  if (names.size() == 1) cfg["attention_layers"] = drivers::attention_layers(c0_);
  cfg["partition"] = d.get_string("data.partition");
  st.config(cfg, skipped);
  if (st.out()) {
    st.out()->config_int("tokens", batch.layout.total());
    if (st.check) {
      for (std::size_t i = 0; i < c0_.pattern.size(); ++i)
        st.out()->tensor("/activations/reference/block_" + std::to_string(i), st.root() ? ref_blocks_[i] : Tensor(),
                         "[T,hidden] real tokens, global order", "1");
      st.out()->tensor("/gradients/reference/logits", ref_dlogits_, "[T,vocab] real tokens, global order", "1/token");
      for (auto& [n, t] : p_)
        st.out()->tensor("/gradients/reference/" + n, st.root() ? rg_.at(n) : Tensor(), "parameter shape", "1");
    }
  }
  if (st.keeps_inputs()) {  // run.save = inputs: token ids and labels (real tokens, global order), parameters
    st.input_layout();
    const auto as_tensor = [](const std::vector<std::int64_t>& v) {
      return Tensor::from(std::vector<double>(v.begin(), v.end()), {static_cast<std::int64_t>(v.size())}, DType::F64);
    };
    st.input_whole("tokens", as_tensor(rtok_), "[T] token ids, real tokens, global order", "id");
    st.input_whole("labels", as_tensor(rlab_), "[T] label ids (-100: no label), real tokens, global order", "id");
    model::ParamMap ph;
    for (const auto& [n, t] : p_) ph[n] = drivers::host(t);
    drivers::write_params(*st.out(), *st.ctx.world, "/inputs/params/", ph, shards_, owner_, "parameter shape");
  }
  st.header(drivers::fields("pattern", c0_.pattern, "format", d.get_string("data.format"), "tokens",
                            batch.layout.total(), "sequences", batch.layout.nseq(), "label_tokens", batch.label_tokens,
                            "hidden", c0_.hidden, "vocab", c0_.vocab, "mamba_cp", d.get_string("parallel.mamba_cp")),
            skipped);
  st.record_placement(model::hybrid_doc_cost(c0_));
  if (st.check && st.root()) std::printf("# cp=1 reference on rank 0: loss %.12f\n", ref_.loss);
  // Parameters this rank holds (the routed experts' 1/ep), as counted from the sizes.
  const model::ParamCount pc = model::param_count(c0_, groups_->size());
  std::int64_t held = 0;
  for (const auto& [n, t] : p_) held += t.numel();
  HCP_CHECK(held == pc.total, "cp_hybrid: this rank holds ", held, " parameter elements, the count says ", pc.total);
  st.write_parameter_memory(static_cast<double>(held), static_cast<double>(pc.experts), groups_->size());
}

bool HybridStudy::run_case(const std::string& name, std::vector<std::string>& row) {
  Study& st = st_;
  model::HybridModel m(st.comm, drivers::hybrid_config(st.deck, name, st.cp), placed_.placement, groups_.get());
  model::ParamMap grads;
  model::StepResult res;
  const drivers::Samples s = st.time(
      [&](PhaseTimes& c) {
        grads.clear();  // the last step's gradients are spent (an optimizer step would take them)
        res = m.step(p_, placed_.tokens, placed_.labels, grads);
        c.lap("step");
        for (auto& [ph, ms] : m.phase_ms()) c.add(ph, ms);
      },
      [&] { m.reset_phases(); });
  const double comm_mb = st.comm.all_reduce_scalar(static_cast<double>(st.bytes_per_step()), ReduceOp::Max) / 1e6;
  model::ParamMap whole;  // the experts' gradients gathered over each EP group, for the check
  if (st.check) whole = drivers::gather_shards(*groups_, shards_, grads);
  for (auto& [n, t] : grads) t = drivers::host(t);
  // Real rows against the unpadded oracle; the logits gradient of a pad is zero (the residual
  // stream of a pad is not: its blocks' outputs are left unchecked).
  Study::Errors e;
  const double loss_err = std::abs(res.loss - ref_.loss) / std::max(std::abs(ref_.loss), 1e-300);
  if (st.check && st.root()) e.add("loss", loss_err);
  st.result(e, "logits_grad", "/gradients/" + name + "/logits", m.dlogits(), ref_dlogits_, true,
            "[T,vocab] real tokens, global order", "1/token");
  for (std::size_t i = 0; i < m.block_outputs().size(); ++i)
    st.result(e, "block_" + std::to_string(i), "/activations/" + name + "/block_" + std::to_string(i),
              m.block_outputs()[i], st.check && st.root() ? ref_blocks_[i] : Tensor(), false,
              "[T,hidden] real tokens, global order", "1");
  if (st.check && st.root())
    for (auto& [n, t] : rg_) st.compare(e, "d" + n, drivers::host(whole.at(n)), t);
  st.cross_scalar(e, "loss", res.loss);
  for (auto& [n, t] : grads) st.cross_compare(e, "d" + n, t);  // each rank its experts' rows
  const double flips = routing_flips(st, m, ref_routing_);
  const bool loss_ok = !st.check || !st.root() || loss_err <= std::min(st.tol, kBf16LossTol);
  const bool pass = st.verdict(name, e, flips <= kMaxFlips && loss_ok);
  if (st.out() && st.check) st.out()->attribute("/summary/" + name, "routing_flips", drivers::fmt("%.6f", flips));
  if (st.out()) {
    drivers::write_params(*st.out(), *st.ctx.world, "/gradients/" + name + "/", grads, shards_, owner_,
                          "parameter shape");
  }
  st.phase_memory(m.phase_peaks());
  st.write_timings(name, s);
  const double ov = st.overlap(name, s);
  std::string phases;
  for (auto& [ph, v] : s)
    if (ph != "step" && ph != "ring_wait") phases += " " + ph + "=" + drivers::fmt("%.1f", st.slowest(v));
  row = {name,
         drivers::fmt("%16.12f", res.loss),
         drivers::fmt("%.2f", st.slowest(s.at("step"))),
         drivers::fmt("%.3f", comm_mb),
         ov < 0           ? "-"
         : std::isnan(ov) ? "n/a"
                          : drivers::fmt("%.2f", ov),
         st.check || st.cross ? drivers::fmt("%.1e", e.worst) : std::string("unchecked"),
         st.check ? drivers::fmt("%.4f", flips) : "-",
         phases};
  return pass;
}

}  // namespace hcp::drivers
