#include "attention_study.hpp"

#include <cmath>

#include "common.hpp"
#include "cp/layout.hpp"
#include "layer_keys.hpp"

namespace hcp::drivers {
namespace k = hcp::kernels;

cp::CpAttnConfig attention_config(const Deck& d, int cp, const std::string& strategy) {
  const drivers::AttnShape a = drivers::attention_from_deck(d);
  cp::CpAttnConfig c;
  c.heads = a.heads;
  c.kv_heads = a.kv_heads;
  c.head_dim = a.head_dim;
  c.causal = d.get_bool("attention.causal");
  c.placement = drivers::placement_of(d, cp, drivers::attention_doc_cost(c.causal));
  c.strategy = cp::attn_strategy_from_string(strategy);
  c.cp_inner = drivers::cp_inner_of(d, cp);
  return c;
}

namespace {
const char* kNames[4] = {"out", "dq", "dk", "dv"};
const char* kShapes[4] = {"[T,H,D] real tokens, global order", "[T,H,D] real tokens, global order",
                          "[T,Hkv,D] real tokens, global order", "[T,Hkv,D] real tokens, global order"};

}  // namespace

void AttentionStudy::setup(const std::vector<std::string>& names, const Skipped& skipped) {
  base_ = attention_config(st_.deck, st_.cp, names.front());
  st_.placement = base_.placement;
  const SeqLayout& g = base_.placement.global;
  const std::int64_t T = g.total(), H = base_.heads, Hkv = base_.kv_heads, D = base_.head_dim;
  const auto seed = static_cast<std::uint64_t>(st_.deck.get_int("data.seed"));
  qs_ = {H, D};
  ks_ = {Hkv, D};
  for (int i = 0; i < 4; ++i) seeds_[i] = seed * 4 + static_cast<std::uint64_t>(i);
  // cp=1 reference: the host oracle on rank 0, whatever run.device is, on the unpadded problem (each
  // sequence at its real length; the CP runs' pads must not change the real tokens' results).
  if (st_.check && st_.root()) {
    const SeqLayout u = g.unpadded();
    Tensor in[4];
    for (int i = 0; i < 4; ++i) in[i] = drivers::unpadded_uniform(g, i == 1 || i == 2 ? ks_ : qs_, st_.dt, seeds_[i]);
    k::AttnParams p;
    p.heads = H;
    p.kv_heads = Hkv;
    p.head_dim = D;
    p.mask = base_.causal ? k::Mask::Causal : k::Mask::None;
    p.segments = k::segments_from_layout(u, u);
    for (int i = 0; i < 4; ++i) ref_[i] = Tensor::zeros(i < 2 ? in[0].shape() : in[1].shape(), st_.dt);
    Tensor lse = Tensor::zeros({u.total(), H}, st_.dt);
    k::attention_fwd(ref_[0], lse, in[0], in[1], in[2], p);
    k::attention_bwd(ref_[1], ref_[2], ref_[3], in[0], in[1], in[2], ref_[0], lse, in[3], p);
  }
  st_.config({{"format", st_.deck.get_string("data.format")},
              {"strategy", drivers::join(names)},
              {"cu_seqlens_padded", drivers::join(g.cu_seqlens)},
              {"partition", st_.deck.get_string("data.partition")}},
             skipped);
  if (st_.out() && st_.check)
    for (int i = 0; i < 4; ++i)
      st_.out()->tensor(std::string(i ? "/gradients/reference/" : "/activations/reference/") + kNames[i], ref_[i],
                        kShapes[i], "1");
  st_.header(drivers::fields("format", st_.deck.get_string("data.format"), "tokens", T, "sequences", g.nseq(), "heads",
                             H, "kv_heads", Hkv, "head_dim", D, "causal", base_.causal ? 1 : 0),
             skipped);
  st_.record_placement(drivers::attention_doc_cost(base_.causal));
  if (st_.keeps_inputs()) {  // run.save = inputs: what every case starts from
    const char* in_names[4] = {"q", "k", "v", "dout"};
    st_.input_layout();
    for (int i = 0; i < 4; ++i)
      st_.input(in_names[i], drivers::rows_uniform(st_.local_rows(), i == 1 || i == 2 ? ks_ : qs_, st_.dt, seeds_[i]),
                i == 1 || i == 2 ? "[T,Hkv,D] real tokens, global order" : "[T,H,D] real tokens, global order", "1");
  }
}

bool AttentionStudy::run_case(const std::string& name, std::vector<std::string>& row) {
  Study& st = st_;
  cp::CpAttention attn(st.comm, attention_config(st.deck, st.cp, name));
  const std::vector<std::int64_t> rows = st.local_rows();
  Tensor ql = local(rows, 0), kl = local(rows, 1), vl = local(rows, 2), dol = local(rows, 3);
  Tensor got[4] = {Tensor::zeros(ql.shape(), st.dt, st.space), Tensor::zeros(ql.shape(), st.dt, st.space),
                   Tensor::zeros(kl.shape(), st.dt, st.space), Tensor::zeros(vl.shape(), st.dt, st.space)};
  const drivers::Samples s = st.time([&](PhaseTimes& c) {
    attn.forward(got[0], ql, kl, vl);
    c.lap("forward");
    attn.backward(got[1], got[2], got[3], dol);
    c.lap("backward");
    c.add("compute", (attn.fwd_times().compute + attn.bwd_times().compute) * 1e3);
    c.add("comm_wait", (attn.fwd_times().comm_wait + attn.bwd_times().comm_wait) * 1e3);
  });
  // Logical payload this rank handed to the communicator per step, against the strategy's model,
  // on every rank (the table shows the max over ranks).
  const std::int64_t sent = st.bytes_per_step(), mine = attn.model_fwd_bytes(st.dt) + attn.model_bwd_bytes(st.dt);
  const auto [bytes_ok, bytes, model] = st.check_bytes(sent, mine);
  st.write_timings(name, s);
  const double ov = st.overlap(name, s);
  Study::Errors e;
  std::vector<std::string> errs;
  for (int i = 0; i < 4; ++i) {  // each tensor's real rows against the oracle, its pad rows against zero
    const std::size_t n0 = e.rel.size();
    st.result(e, kNames[i], (i ? "/gradients/" : "/activations/") + name + "/" + kNames[i], got[i], ref_[i], true,
              kShapes[i], "1");
    double worst = -1;
    for (std::size_t j = n0; j < e.rel.size(); ++j) worst = nan_max(worst, e.rel[j].second);
    errs.push_back(worst < 0 ? "-" : drivers::fmt("%.2e", worst));
  }
  const bool pass = st.verdict(name, e, bytes_ok);
  row = {name,
         drivers::fmt("%.3f", st.slowest(s.at("forward"))),
         drivers::fmt("%.3f", st.slowest(s.at("backward"))),
         drivers::fmt("%.3f", st.slowest(s.at("compute"))),
         drivers::fmt("%.3f", st.slowest(s.at("comm_wait"))),
         ov < 0           ? "-"
         : std::isnan(ov) ? "n/a"
                          : drivers::fmt("%.2f", ov),
         drivers::fmt_int(bytes),
         drivers::fmt_int(model),
         errs[0],
         errs[1],
         errs[2],
         errs[3],
         st.check || st.cross ? (pass ? "yes" : "NO") : "-"};
  return pass;
}

}  // namespace hcp::drivers
