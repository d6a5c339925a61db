#include "generate_study.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common.hpp"
#include "model/decode.hpp"

namespace hcp::drivers {

void GenerateStudy::setup(const std::vector<std::string>& names, const Skipped& skipped) {
  Study& st = st_;
  const Deck& d = st.deck;
  seed_ = static_cast<std::uint64_t>(d.get_int("data.seed"));
  g_ = drivers::generate_config(d);
  c0_ = drivers::hybrid_config(d, names.front(), st.cp);
  placed_ = drivers::placed_batch(d, st.cp, st.grid.cp_rank, c0_, seed_);
  st.placement = placed_.placement;
  groups_ = std::make_unique<ExpertGroups>(st.comm, drivers::ep_size_of(d, c0_, st.cp));
  p_ = drivers::in_space(model::hybrid_init(c0_, st.dt, seed_, groups_.get()), st.space);
  c1_ = c0_;
  c1_.ep = 1;
  prompts_ = drivers::prompts_of(placed_.batch);
  if (st.check && st.root()) {
    p1_ = drivers::in_space(model::hybrid_init(c1_, st.dt, seed_), st.space);
    model::HybridModel m(st.self, c1_, drivers::unpadded_thd(prompts_));
    ref_ = drivers::generate(st.self, m, p1_, drivers::concat(prompts_), g_, nullptr);
  }
  st.config({{"format", d.get_string("data.format")},
             {"strategy", drivers::join(names)},
             {"mamba_cp", d.get_string("parallel.mamba_cp")},
             {"pattern", c0_.pattern},
             {"new_tokens", std::to_string(g_.new_tokens)},
             {"sampling", g_.sampling},
             {"temperature", drivers::fmt("%.17g", g_.temperature)},
             {"sample_seed", std::to_string(g_.seed)}},
            skipped);
  if (st.out()) {
    std::vector<std::int64_t> lens;
    for (const auto& q : prompts_) lens.push_back(static_cast<std::int64_t>(q.size()));
    st.out()->counts("/generate/prompt_lengths", lens, "[sequences]", "tokens");
    st.out()->counts("/generate/prompt", drivers::concat(prompts_), "[T] prompt token ids, sequences packed", "id");
    if (st.check)
      st.out()->counts("/generate/reference/ids", st.root() ? ref_.flat_ids() : std::vector<std::int64_t>{},
                       "[sequences * new_tokens] sequence-major, cp=1 prefill and decode", "id");
  }
  st.header(drivers::fields("pattern", c0_.pattern, "format", d.get_string("data.format"), "tokens",
                            placed_.batch.layout.total(), "sequences", placed_.batch.layout.nseq(), "new_tokens",
                            g_.new_tokens, "sampling", g_.sampling, "mamba_cp", d.get_string("parallel.mamba_cp")),
            skipped);
}

bool GenerateStudy::run_case(const std::string& name, std::vector<std::string>& row) {
  Study& st = st_;
  model::HybridModel m(st.comm, drivers::hybrid_config(st.deck, name, st.cp), placed_.placement, groups_.get());
  drivers::Generated got;
  const drivers::Samples s =
      st.time([&](PhaseTimes& c) { got = drivers::generate(st.comm, m, p_, placed_.tokens, g_, &c, placed_.labels); });
  const std::vector<std::int64_t> ids = got.flat_ids();
  const bool ranks_agree = drivers::ranks_agree(st.comm, ids);  // each rank chose them from its logits
  Study::Errors e;
  bool ids_equal = true;
  if (st.check && st.root()) {
    ids_equal = ids == ref_.flat_ids();
    // Teacher forcing: cp = 1 over each prompt and the tokens generated before the last.
    const Tensor tf = drivers::teacher_forced_logits(st.self, c1_, p1_, prompts_, got);
    for (std::int64_t t = 0; t < g_.new_tokens; ++t)
      st.compare(e, "logits_" + std::to_string(t), st.planted(got.logits[static_cast<std::size_t>(t)]),
                 tf.slice(0, t, 1).view(got.logits[static_cast<std::size_t>(t)].shape()));
  }
  for (std::int64_t t = 0; t < g_.new_tokens; ++t)  // run.check = cross: against the first case's
    st.cross_compare(e, "logits_" + std::to_string(t), got.logits[static_cast<std::size_t>(t)]);
  // The decode's own exchanges and the prefill's attention and Mamba2 blocks against their models.
  const std::map<char, std::int64_t> prefill_model = drivers::prefill_model_bytes(m, st.grid.cp_rank, st.dt);
  const bool mine = drivers::bytes_match_models(name, got, m, st.grid.cp_rank, st.cp, st.dt, prefill_model);
  const bool bytes_ok = st.comm.all_reduce_scalar(mine ? 0.0 : 1.0, ReduceOp::Max) == 0;
  const bool pass = st.verdict(name, e, ids_equal && ranks_agree && bytes_ok);
  const drivers::GenerateBytes b = drivers::generate_bytes_sent(st.comm, got);
  if (st.out()) {
    std::vector<double> errs;  // rank 0's (the others hold none)
    for (const auto& [n, v] : e.rel) errs.push_back(v);
    drivers::write_generation(*st.out(), name, got, b, st.check, st.root() ? errs : std::vector<double>{},
                              prefill_model);
  }
  st.phase_memory(m.phase_peaks());
  st.write_timings(name, s);
  const auto per = static_cast<double>(std::max<std::int64_t>(got.decode_steps(), 1));
  row = {name,
         drivers::fmt("%.2f", st.slowest(s.at("prefill"))),
         drivers::fmt("%.2f", st.slowest(s.at("handoff"))),
         drivers::fmt("%.3f", st.slowest(s.at("decode")) / per),
         drivers::fmt("%.3f", b.prefill_max / 1e6),
         drivers::fmt("%.3f", b.decode_max / 1e3),
         drivers::fmt("%.3f", b.handoff_max / 1e6),
         !st.check                  ? "-"
         : ids_equal && ranks_agree ? "same"
                                    : "DIFFER",
         st.check || st.cross ? drivers::fmt("%.1e", e.worst) : std::string("unchecked")};
  return pass;
}

}  // namespace hcp::drivers
