#include "model/layers.hpp"

#include <cmath>

#include "cp/layout.hpp"

namespace hcp::model {
namespace k = hcp::kernels;

namespace {
// The fill seed of parameter `name` of a layer seeded `seed`: the same on every platform, different
// for every name.
std::uint64_t param_seed(std::uint64_t seed, const std::string& name) { return mix64(seed ^ name_hash(name)); }
}  // namespace

void init_param(ParamMap& p, const std::string& name, const Shape& s, DType dt, std::uint64_t seed, double lo,
                double hi) {
  Tensor t = Tensor::empty(s, dt);
  fill_uniform(t, param_seed(seed, name), lo, hi);
  p[name] = t;
}

void init_param_rows(ParamMap& p, const std::string& name, const Shape& whole, RowRange r, DType dt, std::uint64_t seed,
                     double lo, double hi) {
  if (r.rows < 0) return init_param(p, name, whole, dt, seed, lo, hi);
  HCP_CHECK(!whole.empty() && r.first >= 0 && r.first + r.rows <= whole[0], "init_param_rows: rows [", r.first, ", ",
            r.first + r.rows, ") of ", name, " ", shape_str(whole));
  Shape s = whole;
  s[0] = r.rows;
  std::vector<std::int64_t> rows(static_cast<std::size_t>(r.rows));
  for (std::int64_t i = 0; i < r.rows; ++i) rows[static_cast<std::size_t>(i)] = r.first + i;
  Tensor t = Tensor::empty(s, dt);
  fill_uniform_rows(t, param_seed(seed, name), rows, lo, hi);
  p[name] = t;
}

ParamMap init_params(const std::vector<ParamSpec>& specs, DType dt, std::uint64_t seed, RowRange experts) {
  ParamMap p;
  for (const ParamSpec& sp : specs) {
    const std::string& drawn = sp.seed_name.empty() ? sp.name : sp.seed_name;
    ParamMap one;
    if (sp.expert_rows)
      init_param_rows(one, drawn, sp.shape, experts, dt, seed + sp.seed_offset, sp.lo, sp.hi);
    else
      init_param(one, drawn, sp.shape, dt, seed + sp.seed_offset, sp.lo, sp.hi);
    p[sp.name] = one.at(drawn);
  }
  return p;
}

void reduce_grad(Communicator& c, Tensor& g) {
  if (c.size() == 1) return;  // one rank: the sum is the gradient itself
  if (g.dtype() != DType::BF16) {
    c.all_reduce(g);
    return;
  }
  Tensor wide = g.to(DType::F32);
  c.all_reduce(wide);
  g.copy_from(wide.to(DType::BF16));
}

namespace {
double inv_sqrt(std::int64_t n) { return 1.0 / std::sqrt(static_cast<double>(n)); }
void all_reduce_grads(Communicator& c, ParamMap& g) {
  for (auto& [n, t] : g) reduce_grad(c, t);
}
}  // namespace

// ================================ attention ======================================================
std::vector<ParamSpec> attention_params(const AttnLayerConfig& c) {
  const double a = inv_sqrt(c.hidden), o = inv_sqrt(c.heads * c.head_dim);
  return {{"Wq", {c.heads * c.head_dim, c.hidden}, -a, a},
          {"Wk", {c.kv_heads * c.head_dim, c.hidden}, -a, a},
          {"Wv", {c.kv_heads * c.head_dim, c.hidden}, -a, a},
          {"Wo", {c.hidden, c.heads * c.head_dim}, -o, o}};
}
ParamMap attention_init(const AttnLayerConfig& c, DType dt, std::uint64_t seed) {
  return init_params(attention_params(c), dt, seed);
}

cp::CpAttnConfig cp_attn_config(const AttnLayerConfig& c, const cp::Placement& placement) {
  cp::CpAttnConfig a;
  a.strategy = c.strategy;
  a.cp_inner = c.cp_inner;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.causal = c.causal;
  a.placement = placement;
  return a;
}

AttentionLayer::AttentionLayer(Communicator& comm, AttnLayerConfig cfg, const cp::Placement& placement,
                               std::shared_ptr<CpLevels> levels)
    : comm_(comm), c_(cfg), attn_(comm, cp_attn_config(cfg, placement), std::move(levels)) {
  tl_ = placement.local_rows(comm.rank());
  if (c_.rope_theta > 0) pos_ = placement.positions(comm.rank());
}

void AttentionLayer::forward(Tensor& y, const Tensor& x, const ParamMap& p) {
  SpaceScope space_scope(x.space());
  const DType dt = x.dtype();
  const std::int64_t H = c_.heads, Hk = c_.kv_heads, D = c_.head_dim;
  x_ = x.view({tl_, c_.hidden});
  Tensor q = Tensor::zeros({tl_, H * D}, dt), kk = Tensor::zeros({tl_, Hk * D}, dt),
         v = Tensor::zeros({tl_, Hk * D}, dt);
  k::linear_fwd(q, x_, p.at("Wq"), nullptr);
  k::linear_fwd(kk, x_, p.at("Wk"), nullptr);
  k::linear_fwd(v, x_, p.at("Wv"), nullptr);
  q = q.view({tl_, H, D});
  kk = kk.view({tl_, Hk, D});
  v = v.view({tl_, Hk, D});
  if (c_.rope_theta > 0) {
    Tensor qr = Tensor::zeros(q.shape(), dt), kr = Tensor::zeros(kk.shape(), dt);
    k::rope_fwd(qr, q, pos_, c_.rope_theta, D);
    k::rope_fwd(kr, kk, pos_, c_.rope_theta, D);
    q = qr;
    kk = kr;
  }
  if (keep_kv_) {
    k_ = kk;
    v_ = v;
  }
  o_ = Tensor::zeros({tl_, H, D}, dt);
  attn_.forward(o_, q, kk, v);
  Tensor out = Tensor::zeros({tl_, c_.hidden}, dt);
  k::linear_fwd(out, o_.view({tl_, H * D}), p.at("Wo"), nullptr);
  y.copy_from(out.view(y.shape()));
}

void AttentionLayer::backward(Tensor& dx, ParamMap& grads, const Tensor& dy, const ParamMap& p) {
  SpaceScope space_scope(dy.space());
  HCP_CHECK(o_.defined(), "attention: backward() before forward()");
  const DType dt = x_.dtype();
  const std::int64_t H = c_.heads, Hk = c_.kv_heads, D = c_.head_dim;
  grads = zeros_like(p);
  Tensor dyv = dy.view({tl_, c_.hidden}), dout = Tensor::zeros({tl_, H * D}, dt);
  k::linear_bwd(&dout, &grads["Wo"], nullptr, o_.view({tl_, H * D}), p.at("Wo"), dyv);
  Tensor dq = Tensor::zeros({tl_, H, D}, dt), dk = Tensor::zeros({tl_, Hk, D}, dt),
         dv = Tensor::zeros({tl_, Hk, D}, dt);
  attn_.backward(dq, dk, dv, dout.view({tl_, H, D}));
  if (c_.rope_theta > 0) {
    Tensor a = Tensor::zeros(dq.shape(), dt), b = Tensor::zeros(dk.shape(), dt);
    k::rope_bwd(a, dq, pos_, c_.rope_theta, D);
    k::rope_bwd(b, dk, pos_, c_.rope_theta, D);
    dq = a;
    dk = b;
  }
  Tensor acc = Tensor::zeros({tl_, c_.hidden}, dt), part = Tensor::zeros({tl_, c_.hidden}, dt);
  k::linear_bwd(&acc, &grads["Wq"], nullptr, x_, p.at("Wq"), dq.view({tl_, H * D}));
  k::linear_bwd(&part, &grads["Wk"], nullptr, x_, p.at("Wk"), dk.view({tl_, Hk * D}));
  k::axpy(acc, 1.0, part);
  k::linear_bwd(&part, &grads["Wv"], nullptr, x_, p.at("Wv"), dv.view({tl_, Hk * D}));
  k::axpy(acc, 1.0, part);
  dx.copy_from(acc.view(dx.shape()));
  release_saved(x_, o_);
  all_reduce_grads(comm_, grads);
}

// ================================ dense MLP ======================================================
std::vector<ParamSpec> mlp_params(const MlpConfig& c) {
  const std::int64_t F1 = k::first_projection_rows(c.act, c.ffn);
  return {{"W1", {F1, c.hidden}, -inv_sqrt(c.hidden), inv_sqrt(c.hidden)},
          {"W2", {c.hidden, c.ffn}, -inv_sqrt(c.ffn), inv_sqrt(c.ffn)}};
}
ParamMap mlp_init(const MlpConfig& c, DType dt, std::uint64_t seed) { return init_params(mlp_params(c), dt, seed); }

// A dense MLP is the grouped expert MLP with one expert holding every row.
void MlpLayer::forward(Tensor& y, const Tensor& x, const ParamMap& p) {
  SpaceScope space_scope(x.space());
  const Tensor& W1 = p.at("W1");
  const std::int64_t T = x.numel() / c_.hidden, F1 = W1.size(0);
  x_ = x.view({T, c_.hidden});
  h_ = Tensor::zeros({T, F1}, x.dtype());
  Tensor out = Tensor::zeros({T, c_.hidden}, x.dtype());
  k::expert_mlp_fwd(out, h_, x_, W1.view({1, F1, c_.hidden}), p.at("W2").view({1, c_.hidden, c_.ffn}), {T}, c_.act);
  y.copy_from(out.view(y.shape()));
}

void MlpLayer::backward(Tensor& dx, ParamMap& grads, const Tensor& dy, const ParamMap& p) {
  SpaceScope space_scope(dy.space());
  HCP_CHECK(h_.defined(), "mlp: backward() before forward()");
  const Tensor& W1 = p.at("W1");
  const std::int64_t T = x_.size(0), F1 = W1.size(0);
  grads = zeros_like(p);
  Tensor dxl = Tensor::zeros({T, c_.hidden}, x_.dtype());
  Tensor dW1 = grads["W1"].view({1, F1, c_.hidden}), dW2 = grads["W2"].view({1, c_.hidden, c_.ffn});
  k::expert_mlp_bwd(dxl, dW1, dW2, x_, W1.view({1, F1, c_.hidden}), p.at("W2").view({1, c_.hidden, c_.ffn}), h_, {T},
                    c_.act, dy.view({T, c_.hidden}));
  release_saved(x_, h_);
  dx.copy_from(dxl.view(dx.shape()));
  all_reduce_grads(comm_, grads);
}

// ================================ MoE ============================================================
k::RouterParams MoeConfig::router() const {
  k::RouterParams r;
  r.experts = experts;
  r.topk = topk;
  r.sigmoid = sigmoid;
  r.renormalize = renormalize;
  r.scaling = scaling;
  return r;
}

bool is_expert_weight(const std::string& n) { return n == "W1" || n == "W2"; }

std::vector<ParamSpec> moe_params(const MoeConfig& c) {
  const std::int64_t F1 = k::first_projection_rows(c.act, c.ffn);
  const double a = inv_sqrt(c.hidden), f = inv_sqrt(c.ffn);
  std::vector<ParamSpec> s{{"router", {c.experts, c.hidden}, -a, a},
                           {"e_bias", {c.experts}, -0.05, 0.05},
                           {"W1", {c.experts, F1, c.hidden}, -a, a, 0, true},
                           {"W2", {c.experts, c.hidden, c.ffn}, -f, f, 0, true}};
  if (c.shared_ffn > 0)
    for (ParamSpec m : mlp_params(MlpConfig{c.hidden, c.shared_ffn, c.act})) {
      m.seed_name = m.name;  // drawn as the shared MLP's own W1 / W2
      m.name = "shared_" + m.name;
      m.seed_offset = 17;
      s.push_back(m);
    }
  return s;
}
ParamMap moe_init(const MoeConfig& c, DType dt, std::uint64_t seed, RowRange experts) {
  return init_params(moe_params(c), dt, seed, experts);
}

MoeLayer::MoeLayer(Communicator& ep, Communicator& replicas, Communicator& grad, MoeConfig cfg)
    : ep_(ep), replica_(replicas), grad_(grad), c_(cfg) {
  cp::ep_experts(c_.experts, ep_.size(), ep_.rank());  // throws unless the experts split over the group
  HCP_CHECK(c_.topk >= 1 && c_.topk <= c_.experts, "moe.topk (", c_.topk, ") must be in [1, moe.experts = ", c_.experts,
            "]");
}

namespace {
ParamMap shared_params(const ParamMap& p) { return {{"W1", p.at("shared_W1")}, {"W2", p.at("shared_W2")}}; }
DType router_dtype(DType dt) { return acc_dtype(dt); }
// `t` in dtype `dt`: itself when it already is, else a converted copy.
Tensor as_dtype(const Tensor& t, DType dt) { return t.dtype() == dt ? t : t.to(dt); }
}  // namespace

void MoeLayer::forward(Tensor& y, const Tensor& x, const ParamMap& p) {
  SpaceScope space_scope(x.space());
  const DType dt = x.dtype();
  const std::int64_t C = c_.hidden, E = c_.experts, K = c_.topk, T = x.numel() / C;
  x_ = x.view({T, C});
  // bf16 runs route in fp32 (logits, scores, top-k weights), as Megatron does: the expert choice
  // is then as stable as the input allows. The combine takes the weights in the run's dtype.
  const DType rt = router_dtype(dt);
  Tensor logits = Tensor::zeros({T, E}, rt);
  k::linear_fwd(logits, as_dtype(x_, rt), as_dtype(p.at("router"), rt), nullptr);
  scores_ = Tensor::zeros({T, E}, rt);
  Tensor topk_w = Tensor::zeros({T, K}, rt);
  const auto rp = c_.router();
  const Tensor e_bias = as_dtype(p.at("e_bias"), rt);
  k::router_fwd(scores_, route_, topk_w, logits, &e_bias, rp);
  topk_w_ = as_dtype(topk_w, dt);
  // Row buffers that a kernel writes whole are left unfilled (`empty`); zero-filled only where the
  // kernel does not run.
  Tensor xp = Tensor::empty({T * K, C}, dt);
  if (T > 0) k::moe_permute(xp, route_, x_);
  disp_ = std::make_unique<cp::EpDispatcher>(ep_, E, route_.counts);
  local_counts_ = disp_->local_counts();
  xl_ = disp_->dispatch(xp);
  const std::int64_t el = disp_->local_experts(), F1 = p.at("W1").size(1);
  for (const char* n : {"W1", "W2"})
    HCP_CHECK(p.at(n).size(0) == el, "moe: ", n, " holds ", p.at(n).size(0), " experts; EP rank ", ep_.rank(), " of ",
              ep_.size(), " holds ", el, " (experts ", disp_->first_expert(), "..", disp_->first_expert() + el - 1,
              ")");
  h_ = Tensor::empty({disp_->local_rows(), F1}, dt);
  Tensor yl = Tensor::empty({disp_->local_rows(), C}, dt);
  if (disp_->local_rows() > 0) k::expert_mlp_fwd(yl, h_, xl_, p.at("W1"), p.at("W2"), disp_->local_counts(), c_.act);
  yp_ = disp_->combine(yl);
  Tensor out = Tensor::empty({T, C}, dt);
  if (T > 0) k::moe_combine_fwd(out, yp_, route_, topk_w_);
  if (c_.shared_ffn > 0) {
    shared_ = std::make_unique<MlpLayer>(grad_, MlpConfig{C, c_.shared_ffn, c_.act});
    Tensor ys = Tensor::zeros({T, C}, dt);
    shared_->forward(ys, x_, shared_params(p));
    k::axpy(out, 1.0, ys);
  }
  y.copy_from(out.view(y.shape()));
}

void MoeLayer::drop_saved() {
  x_ = scores_ = topk_w_ = xl_ = h_ = yp_ = Tensor();
  route_.src = route_.inv = Tensor();
  disp_.reset();
  shared_.reset();
}

void MoeLayer::backward(Tensor& dx, ParamMap& grads, const Tensor& dy, const ParamMap& p) {
  SpaceScope space_scope(dy.space());
  HCP_CHECK(disp_, "moe: backward() before forward()");
  const DType dt = x_.dtype();
  const std::int64_t C = c_.hidden, E = c_.experts, K = c_.topk, T = x_.size(0);
  // Each gradient is made once, where it is computed (the shared expert's by its MlpLayer); the
  // row buffers of the routed path are dropped as soon as they are spent.
  grads.clear();
  // The grouped MLP writes every element of the expert weights' gradients (zero for an expert that
  // received no row) whenever it runs.
  const bool mlp_runs = disp_->local_rows() > 0;
  for (const char* n : {"W1", "W2", "e_bias", "router"}) {
    const bool whole = mlp_runs && is_expert_weight(n);
    grads[n] =
        whole ? Tensor::empty(p.at(n).shape(), p.at(n).dtype()) : Tensor::zeros(p.at(n).shape(), p.at(n).dtype());
  }
  Tensor dyv = dy.view({T, C}), dxl = Tensor::empty({T, C}, dt);  // moe_permute_bwd writes every row
  // Routed experts: combine -> (dispatch) -> grouped MLP -> (combine) -> permute.
  Tensor dyp = Tensor::empty(yp_.shape(), dt), dw = Tensor::empty({T, K}, dt);
  if (T > 0) k::moe_combine_bwd(dyp, dw, dyv, yp_, route_, topk_w_);
  release_saved(yp_, topk_w_);
  Tensor dyl = disp_->dispatch(dyp);
  Tensor dxloc = dyl;  // the grouped MLP writes dx over dy once dy is spent (expert_mlp_bwd)
  if (disp_->local_rows() > 0)
    k::expert_mlp_bwd(dxloc, grads["W1"], grads["W2"], xl_, p.at("W1"), p.at("W2"), h_, disp_->local_counts(), c_.act,
                      dyl);
  release_saved(xl_, h_, dyl, dyp);
  Tensor dxp = disp_->combine(dxloc);
  release_saved(dxloc);
  disp_.reset();
  if (T > 0) {
    k::moe_permute_bwd(dxl, dxp, route_);
    release_saved(dxp);
    // Router: top-k weights -> scores -> logits -> router weight and x.
    const DType rt = router_dtype(dt);
    Tensor dlogits = Tensor::zeros({T, E}, rt), dxr = Tensor::zeros({T, C}, rt);
    Tensor dWr = Tensor::zeros(p.at("router").shape(), rt);
    k::router_bwd(dlogits, scores_, route_, as_dtype(dw, rt), nullptr, c_.router());
    k::linear_bwd(&dxr, &dWr, nullptr, as_dtype(x_, rt), as_dtype(p.at("router"), rt), dlogits);
    grads["router"] = as_dtype(dWr, dt);
    k::axpy(dxl, 1.0, as_dtype(dxr, dt));
  }
  release_saved(scores_);
  release_saved(route_.src, route_.inv);
  // The router's gradient is a partial sum over this rank's tokens; the experts' over the tokens
  // they received, so it is summed over the ranks holding the same experts only.
  reduce_grad(grad_, grads["router"]);
  for (const char* n : {"W1", "W2"}) reduce_grad(replica_, grads[n]);
  if (shared_) {
    ParamMap sg;
    Tensor dxs = Tensor::zeros({T, C}, dt);
    shared_->backward(dxs, sg, dyv, shared_params(p));  // all-reduces its own gradients
    grads["shared_W1"] = sg.at("W1");
    grads["shared_W2"] = sg.at("W2");
    k::axpy(dxl, 1.0, dxs);
  }
  release_saved(x_);
  dx.copy_from(dxl.view(dx.shape()));
}

}  // namespace hcp::model
