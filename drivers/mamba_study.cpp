#include "mamba_study.hpp"

#include <cstdio>

#include "common.hpp"
#include "cp/state_passing.hpp"
#include "layer_keys.hpp"

namespace hcp::drivers {

MambaSetup mamba_setup(const Deck& d, int cp) {
  return {cp, drivers::placement_of(d, cp, drivers::token_doc_cost()),
          drivers::mamba_from_deck(d, d.get_int("mamba.hidden")), dtype_from_string(d.get_string("data.dtype"))};
}

void MambaStudy::setup(const std::vector<std::string>& names, const Skipped& skipped) {
  Study& st = st_;
  const MambaSetup& s = s_;
  names_ = names;
  st.placement = s.placement;
  const std::int64_t T = s.global().total(), C = s.cfg.hidden;
  const auto seed = static_cast<std::uint64_t>(st.deck.get_int("data.seed"));
  p_ = model::mamba2_init(s.cfg, s.dt, seed);
  const std::uint64_t sh = seed * 7 + 1, sdy = seed * 7 + 2;
  // cp=1 reference on rank 0: the state-passing layer on host tensors (it runs any heads / n_groups),
  // on the unpadded problem (each sequence at its real length).
  if (st.check && st.root()) {
    const SeqLayout u = s.global().unpadded();
    model::Mamba2SP ref(st.self, s.cfg, u, cp::Partition::Contiguous);  // one rank: any length
    ry_ = Tensor::zeros({u.total(), C}, s.dt);
    rdh_ = Tensor::zeros({u.total(), C}, s.dt);
    ref.forward(ry_, drivers::unpadded_uniform(s.global(), {C}, s.dt, sh), p_);
    ref.backward(rdh_, rg_, drivers::unpadded_uniform(s.global(), {C}, s.dt, sdy), p_);
  }
  // The state scan state passing runs (mamba.state_scan = auto resolved on this layout).
  const std::string scan = model::state_scan_of(s.cfg, s.placement);
  st.config({{"format", st.deck.get_string("data.format")},
             {"strategy", drivers::join(names)},
             {"state_scan", scan},
             {"partition", st.deck.has("data.partition") ? st.deck.get_string("data.partition") : "dcs"}},
            skipped);
  if (st.out() && st.check) {
    st.out()->tensor("/activations/reference/out", ry_, "[T,hidden] real tokens, global order", "1");
    st.out()->tensor("/gradients/reference/input", rdh_, "[T,hidden] real tokens, global order", "1");
  }
  st.header(drivers::fields("format", st.deck.get_string("data.format"), "tokens", T, "sequences", s.global().nseq(),
                            "hidden", C, "heads", s.cfg.heads, "head_dim", s.cfg.head_dim, "n_groups", s.cfg.groups,
                            "d_state", s.cfg.d_state, "conv", s.cfg.conv, "chunk", s.cfg.chunk, "state_scan", scan),
            skipped);
  st.record_placement(drivers::token_doc_cost());
  const std::vector<std::int64_t> rows = st.local_rows();
  hl_ = drivers::rows_uniform(rows, {C}, s.dt, sh).to(st.space);
  dyl_ = drivers::rows_uniform(rows, {C}, s.dt, sdy).to(st.space);
  st.input_layout();  // run.save = inputs: what every case starts from
  st.input("x", hl_, "[T,hidden] real tokens, global order", "1");
  st.input("dout", dyl_, "[T,hidden] real tokens, global order", "1");
  for (auto& [n, t] : p_) st.input_whole("params/" + n, t, "parameter shape", "1");
  for (auto& [n, t] : p_) pd_[n] = t.to(st.space);
}

Study::BytesCheck MambaStudy::check_bytes(const std::string& name, cp::MambaCp strat) {
  Study& st = st_;
  const MambaSetup& s = s_;
  const int r = st.grid.cp_rank;
  // Bytes per rank and step against the model, on every rank (the table shows the max over
  // ranks). State passing: the state scan (all-gather, or the doubling rounds' all_to_all_v) plus
  // the conv halos (all_to_all_v); the halos of all ranks together (what remains after the scan's
  // model) must also equal the chunk-by-chunk total.
  const bool hp = strat == cp::MambaCp::HiddenParallel;
  const std::int64_t sent =
      hp ? st.bytes_per_step({"all_to_all"}) : st.bytes_per_step({"all_to_all_v"}) + st.bytes_per_step({"all_gather"});
  std::int64_t halo = hp ? 0 : sent;
  for (const cp::CpPart& p : s.placement.cp_parts(r))
    if (!hp && !p.empty())
      halo -= cp::model_state_elements_sent(p.placement.global, p.placement.cp, p.rank, cp::Partition::DCS,
                                            s.cfg.state_exchange, s.cfg.heads, s.cfg.head_dim * s.cfg.d_state) *
              static_cast<std::int64_t>(dtype_size(cp::state_scan_dtype(s.dt)));
  const std::int64_t mine = model::mamba_cp_model_bytes(strat, s.cfg, s.placement, r, s.dt);
  Study::BytesCheck bc = st.check_bytes(sent, mine);
  if (!hp) {
    const auto halo_all = static_cast<std::int64_t>(st.comm.all_reduce_scalar(static_cast<double>(halo)));
    std::int64_t halo_model = 0;  // every block's halos
    for (const cp::CpPart& p : s.placement.all_parts())
      if (!p.empty())
        halo_model += 2 * cp::model_halo_rows(p.placement.global, p.placement.cp, cp::Partition::DCS, s.cfg.conv - 1) *
                      s.cfg.conv_dim() * static_cast<std::int64_t>(dtype_size(s.dt));
    bc.ok = bc.ok && halo_all == halo_model;
    halo_note_[name] = drivers::fields("# state_passing conv halo bytes, all ranks:", halo_all, "model", halo_model);
  }
  return bc;
}

bool MambaStudy::run_case(const std::string& name, std::vector<std::string>& row) {
  Study& st = st_;
  const MambaSetup& s = s_;
  const cp::MambaCp strat = model::mamba_cp_from_string(name);
  auto layer = s.make(strat, st.comm);
  Tensor y = Tensor::zeros(hl_.shape(), s.dt, st.space), dh = Tensor::zeros(hl_.shape(), s.dt, st.space);
  model::ParamMap grads;
  const drivers::Samples smp = st.time(
      [&](PhaseTimes& c) {
        grads.clear();  // the last step's gradients are spent (an optimizer step would take them)
        layer->forward(y, hl_, pd_);
        c.lap("forward");
        layer->backward(dh, grads, dyl_, pd_);
        c.lap("backward");
        for (auto& [ph, ms] : layer->phase_ms()) c.add(ph, ms);
      },
      [&] { layer->reset_phases(); });
  const Study::BytesCheck bc = check_bytes(name, strat);
  const std::int64_t allreduce = st.bytes_per_step({"all_reduce"});
  moved_.push_back(bc.max_sent);
  st.phase_memory(layer->phase_peaks());
  st.write_timings(name, smp);
  for (auto& [n, t] : grads) t = drivers::host(t);
  Study::Errors e;  // real rows against the unpadded oracle, pad rows against zero
  st.result(e, "y", "/activations/" + name + "/out", y, ry_, true, "[T,hidden] real tokens, global order", "1");
  st.result(e, "dh", "/gradients/" + name + "/input", dh, rdh_, true, "[T,hidden] real tokens, global order", "1");
  if (st.check && st.root())
    for (auto& [n, t] : rg_) st.compare(e, "d" + n, grads.at(n), t);
  for (auto& [n, t] : grads) st.cross_compare(e, "d" + n, t);
  const bool pass = st.verdict(name, e, bc.ok);
  if (st.out()) {
    for (auto& [n, t] : grads) st.out()->tensor("/gradients/" + name + "/" + n, t, "parameter shape", "1");
  }
  std::string phases = "# " + name + " phases (ms, median, slowest rank):";
  for (auto& [ph, v] : smp)
    if (ph != "forward" && ph != "backward" && ph != "ring_wait")
      phases += " " + ph + "=" + drivers::fmt("%.2f", st.slowest(v));
  notes_.push_back(phases);
  if (halo_note_.count(name)) notes_.push_back(halo_note_.at(name));
  std::string errs =
      "# " + name + (st.cross ? " against " + names_.front() : std::string(" max |cp - cp1| / max |cp1|")) + ":";
  for (auto& [n, v] : e.rel) errs += " " + n + "=" + drivers::fmt("%.1e", v);
  if (!e.rel.empty()) notes_.push_back(errs);
  row = {name,
         drivers::fmt("%.3f", st.slowest(smp.at("forward"))),
         drivers::fmt("%.3f", st.slowest(smp.at("backward"))),
         drivers::fmt_int(bc.max_sent),
         drivers::fmt_int(bc.max_model),
         drivers::fmt_int(allreduce),
         st.check || st.cross ? drivers::fmt("%.1e", e.worst) : std::string("unchecked")};
  return pass;
}

void MambaStudy::notes() const {
  for (const auto& n : notes_) std::printf("%s\n", n.c_str());
  if (moved_.size() == 2 && moved_[0] > 0)
    std::printf("# bytes ratio state_passing / hidden_parallel: %.4f\n",
                static_cast<double>(moved_[1]) / static_cast<double>(moved_[0]));
}

}  // namespace hcp::drivers
