// cp_mamba: one Mamba2 mixer layer under CP against cp=1, for the hidden-parallel and/or the
// state-passing strategy (parallel.mamba_cp): output, input gradient and every parameter gradient
// (gathered / summed), per-rank and per-phase timings, bytes of every communication op against the
// strategy's cost model, written to HDF5.
#include <cstdio>

#include "common.hpp"
#include "cp/layout.hpp"
#include "cp/state_passing.hpp"
#include "device.hpp"
#include "layer_keys.hpp"
#include "model/mamba2.hpp"
#include "model/mamba2_strategy.hpp"
#include "study.hpp"

using namespace hcp;

namespace {
const char* kDeck = R"(# Built-in deck of cp_mamba: a packed THD batch through one Mamba2 mixer, both CP strategies.
[mamba]
hidden = 64
heads = 8          # hidden_parallel: divisible by cp
head_dim = 16
n_groups = 2       # hidden_parallel: n_groups % cp == 0, or cp % n_groups == 0 (groups repeated)
d_state = 16
conv = 4
chunk = 32

[data]
format = "thd"
seq_lens = "100, 37, 250"
batch = 2
seqlen = 256
dtype = "fp64"
seed = 1

[parallel]
cp_size = 0
mamba_cp = "all"   # hidden_parallel | state_passing | all

[run]
warmup = 1
repeats = 3
check = "reference"
)";

DeckSchema schema() {
  DeckSchema s;
  s.add_int("mamba.hidden", 64, "model width", 1);
  drivers::add_mamba_keys(s, {.heads = 8, .head_dim = 16, .groups = 2, .d_state = 16, .conv = 4, .chunk = 32});
  drivers::add_cp_driver_keys(s, "100, 37, 250", 256, /*with_bf16=*/true);
  drivers::add_partition_keys(s);
  drivers::add_device_key(s);
  std::vector<std::string> choices = model::mamba_cp_names();
  choices.emplace_back("all");
  s.add_string("parallel.mamba_cp", "all", "Mamba CP strategy (all: each in turn)", choices)
      .rename_choice("parallel.mamba_cp", "both", "all");
  return s;
}

struct Setup {
  int cp = 1;
  cp::Placement placement;  // DualChunkSwap, or data.partition = documents
  model::Mamba2Config cfg;
  DType dt = DType::F64;
  const SeqLayout& global() const { return placement.global; }
  std::unique_ptr<model::Mamba2Layer> make(cp::MambaCp strat, Communicator& c) const {
    return model::make_mamba2(strat, c, cfg, placement);
  }
};
Setup make_setup(const Deck& d, int cp) {
  return {cp, drivers::placement_of(d, cp, drivers::token_doc_cost()),
          drivers::mamba_from_deck(d, d.get_int("mamba.hidden")), dtype_from_string(d.get_string("data.dtype"))};
}

// The strategies; constructing a layer checks its divisibility rules.
drivers::Cases cases() {
  return {"parallel.mamba_cp",
          "all",
          model::mamba_cp_names(),
          [](const Deck& d, Communicator& c, int cp, const std::string& n) {
            make_setup(d, cp).make(model::mamba_cp_from_string(n), c);
          },
          drivers::mamba_memory,
          [](const Deck& d, int cp) {
            const Setup s = make_setup(d, cp);
            drivers::LayerBytes b;
            drivers::add_mamba_bytes(b, s.cfg, s.placement, s.dt);
            drivers::add_placement(b, d, cp, drivers::token_doc_cost());
            return b;
          }};
}

// One study of cp_mamba: the problem and its cp=1 reference (set up once), then each strategy.
class MambaStudy {
 public:
  explicit MambaStudy(drivers::Study& st) : st_(st), s_(make_setup(st.deck, st.cp)) {}
  void setup(const std::vector<std::string>& names, const drivers::Skipped& skipped);
  bool run_case(const std::string& name, std::vector<std::string>& row);
  void notes() const;

 private:
  // This rank's bytes per step and its model, checked on every rank (and the halos over all ranks
  // against their chunk-by-chunk total); the halo line into notes_.
  drivers::Study::BytesCheck check_bytes(const std::string& name, cp::MambaCp strat);
  drivers::Study& st_;
  const Setup s_;
  std::vector<std::string> names_;
  model::ParamMap p_, pd_;  // parameters: host, and in the run's space
  Tensor hl_, dyl_;         // this rank's input and output gradient
  Tensor ry_, rdh_;         // the cp=1 reference's output and input gradient (rank 0)
  model::ParamMap rg_;      // and its parameter gradients
  std::vector<std::string> notes_;
  std::map<std::string, std::string> halo_note_;  // state passing: the halo bytes line
  std::vector<std::int64_t> moved_;               // bytes per rank of each case
};

void MambaStudy::setup(const std::vector<std::string>& names, const drivers::Skipped& skipped) {
  drivers::Study& st = st_;
  const Setup& s = s_;
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

drivers::Study::BytesCheck MambaStudy::check_bytes(const std::string& name, cp::MambaCp strat) {
  drivers::Study& st = st_;
  const Setup& s = s_;
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
  drivers::Study::BytesCheck bc = st.check_bytes(sent, mine);
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
  drivers::Study& st = st_;
  const Setup& s = s_;
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
  const drivers::Study::BytesCheck bc = check_bytes(name, strat);
  const std::int64_t allreduce = st.bytes_per_step({"all_reduce"});
  moved_.push_back(bc.max_sent);
  st.phase_memory(layer->phase_peaks());
  st.write_timings(name, smp);
  for (auto& [n, t] : grads) t = drivers::host(t);
  drivers::Study::Errors e;  // real rows against the unpadded oracle, pad rows against zero
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

void run(DriverContext& ctx) {
  drivers::Study st(ctx, "cp_mamba", drivers::layer_tolerance);
  MambaStudy m(st);
  st.run(cases(),
         {[&](const std::vector<std::string>& names, const drivers::Skipped& skipped) { m.setup(names, skipped); },
          {{"strategy", 16},
           {"fwd_ms", 10},
           {"bwd_ms", 10},
           {"bytes/rank", 14},
           {"model", 14},
           {"allreduce_B", 14},
           {"max_rel_err", 12}},
          [&](const std::string& name, std::vector<std::string>& row) { return m.run_case(name, row); },
          [&] { m.notes(); },
          "a CP result differs beyond tolerance from what run.check compares it with (the cp=1 reference or the "
          "first case), or bytes from the model",
          [] {
            std::printf("# bytes/rank: sent per step (forward + backward), max over ranks; model: the cost model\n");
          }});
}
}  // namespace

int main(int argc, char** argv) {
  return run_driver(
      argc, argv,
      drivers::study_driver(
          {"cp_mamba", "Mamba2 mixer under hidden-parallel and state-passing context parallelism against cp=1",
           schema(), kDeck, "cp_mamba.h5", cases, run, [](const Deck& d) -> drivers::TensorGroups {
             std::vector<std::string> grads{"input"};
             for (const auto& p : model::mamba2_params(drivers::mamba_from_deck(d, d.get_int("mamba.hidden"))))
               grads.push_back(p.name);
             return {{"activations", {"out"}}, {"gradients", grads}};
           }}));
}
