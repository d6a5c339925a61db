#include "model/hybrid.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hcp::model {
namespace k = hcp::kernels;

void HybridConfig::finalize() {
  HCP_CHECK(!pattern.empty(), "model.pattern must name at least one block");
  for (char ch : pattern)
    HCP_CHECK(ch == 'M' || ch == '*' || ch == 'E' || ch == '-', "model.pattern: '", std::string(1, ch),
              "' is not a block (M Mamba2, * attention, E MoE, - MLP)");
  mamba.hidden = attn.hidden = moe.hidden = mlp.hidden = hidden;
  const auto n_attn = static_cast<std::size_t>(std::count(pattern.begin(), pattern.end(), '*'));
  HCP_CHECK(attn_layers.empty() || attn_layers.size() == n_attn, "parallel.attention lists ", attn_layers.size(),
            " strategies; model.pattern \"", pattern, "\" has ", n_attn, " attention layers");
}

AttnLayerConfig HybridConfig::attention_layer(std::size_t j) const {
  AttnLayerConfig a = attn;
  if (!attn_layers.empty()) a.strategy = attn_layers.at(j);
  return a;
}

namespace {
std::string block_prefix(std::size_t i) {
  char b[32];
  std::snprintf(b, sizeof b, "L%02zu.", i);
  return b;
}
}  // namespace

ParamMap block_params(const ParamMap& p, const std::string& prefix) {
  ParamMap s;
  for (auto it = p.lower_bound(prefix); it != p.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    s[it->first.substr(prefix.size())] = it->second;
  s.erase("norm");
  return s;
}

bool is_buffer(const std::string& name) { return name.size() >= 6 && name.compare(name.size() - 6, 6, "e_bias") == 0; }

RowRange local_experts(const ExpertGroups& groups, std::int64_t total) {
  const cp::ExpertRange r = cp::ep_experts(total, groups.size(), groups.rank());
  return {r.first, r.count};
}

ShardMap expert_shards(const HybridConfig& cin, const ExpertGroups& groups) {
  HybridConfig c = cin;
  c.finalize();
  ShardMap m;
  const RowRange r = local_experts(groups, c.moe.experts);
  for (std::size_t i = 0; i < c.pattern.size(); ++i)
    if (c.pattern[i] == 'E')
      for (const char* n : {"W1", "W2"}) m[block_prefix(i) + n] = {r.first, r.rows, c.moe.experts};
  return m;
}

ParamCount param_count(const HybridConfig& cin, int ep) {
  HybridConfig c = cin;
  c.finalize();
  const std::int64_t C = c.hidden;
  const auto& m = c.mamba;
  const auto& a = c.attn;
  const auto& e = c.moe;
  ParamCount n;
  n.total = 2 * c.vocab * C + C;
  for (char ch : c.pattern) {
    n.total += C;  // the block's norm
    if (ch == 'M')
      n.total += m.d_in_proj() * C + m.conv_dim() * (m.conv + 1) + 3 * m.heads + m.d_inner() + C * m.d_inner();
    if (ch == '*') n.total += 2 * (a.heads + a.kv_heads) * a.head_dim * C;
    if (ch == '-') n.total += (k::first_projection_rows(c.mlp.act, c.mlp.ffn) + c.mlp.ffn) * C;
    if (ch == 'E') {
      const std::int64_t experts = e.experts / std::max(ep, 1) * (k::first_projection_rows(e.act, e.ffn) + e.ffn) * C;
      n.experts += experts;
      n.total += experts + e.experts * (C + 1) +
                 (e.shared_ffn > 0 ? (k::first_projection_rows(e.act, e.shared_ffn) + e.shared_ffn) * C : 0);
    }
  }
  return n;
}

std::vector<std::string> hybrid_param_names(const HybridConfig& cin) {
  HybridConfig c = cin;
  c.finalize();
  std::vector<std::string> n{"embed", "lm_head", "final_norm"};
  for (std::size_t i = 0; i < c.pattern.size(); ++i) {
    const std::string pre = block_prefix(i);
    const std::vector<ParamSpec> specs = c.pattern[i] == 'M'   ? mamba2_params(c.mamba)
                                         : c.pattern[i] == '*' ? attention_params(c.attn)
                                         : c.pattern[i] == 'E' ? moe_params(c.moe)
                                                               : mlp_params(c.mlp);
    for (const ParamSpec& s : specs) n.push_back(pre + s.name);
    n.push_back(pre + "norm");
  }
  return n;
}

ParamMap hybrid_init(const HybridConfig& cin, DType dt, std::uint64_t seed, const ExpertGroups* groups) {
  HybridConfig c = cin;
  c.finalize();
  ParamMap p;
  const double a = 1.0 / std::sqrt(static_cast<double>(c.hidden));
  init_param(p, "embed", {c.vocab, c.hidden}, dt, seed, -1.0, 1.0);
  init_param(p, "lm_head", {c.vocab, c.hidden}, dt, seed, -a, a);
  init_param(p, "final_norm", {c.hidden}, dt, seed, 0.9, 1.1);
  for (std::size_t i = 0; i < c.pattern.size(); ++i) {
    const std::string pre = block_prefix(i);
    const std::uint64_t s = seed * 1000 + i;
    ParamMap m;
    switch (c.pattern[i]) {
      case 'M':
        m = mamba2_init(c.mamba, dt, s);
        break;
      case '*':
        m = attention_init(c.attn, dt, s);
        break;
      case 'E':
        m = moe_init(c.moe, dt, s, groups ? local_experts(*groups, c.moe.experts) : RowRange{});
        break;
      default:
        m = mlp_init(c.mlp, dt, s);
        break;
    }
    for (auto& [n, t] : m) p[pre + n] = t;
    init_param(p, pre + "norm", {c.hidden}, dt, s, 0.9, 1.1);
  }
  return p;
}

template <class F>
void HybridModel::timed(const std::string& name, F&& f) {
  phases_.time(name, default_space(), f);
}

cp::DocCost hybrid_doc_cost(const HybridConfig& h) {
  cp::DocCost c{0.0, 0.0, true};
  const auto C = static_cast<double>(h.hidden);
  for (char k : h.pattern) {
    if (k == '*') {
      const double hd = static_cast<double>(h.attn.heads * h.attn.head_dim);
      c.pair += 2 * hd;
      c.token += C * static_cast<double>((h.attn.heads + 2 * h.attn.kv_heads) * h.attn.head_dim) + hd * C;
    } else if (k == 'M') {
      c.token += C * static_cast<double>(h.mamba.d_in_proj() + h.mamba.d_inner());
    } else if (k == 'E') {
      c.token += 3 * C * static_cast<double>(h.moe.topk * h.moe.ffn + h.moe.shared_ffn);
    } else {
      c.token += 3 * C * static_cast<double>(h.mlp.ffn);
    }
  }
  return c;
}

HybridModel::HybridModel(Communicator& comm, HybridConfig cfg, SeqLayout global, const ExpertGroups* groups)
    : HybridModel(comm, std::move(cfg), cp::Placement::dcs(std::move(global), comm.size()), groups) {}

HybridModel::HybridModel(Communicator& comm, HybridConfig cfg, const cp::Placement& placement,
                         const ExpertGroups* groups)
    : comm_(comm), groups_(groups), c_(std::move(cfg)), placement_(placement) {
  c_.finalize();
  const int cp = comm_.size();
  HCP_CHECK(placement_.cp == cp, "hybrid: the batch is placed over ", placement_.cp, " ranks, run on ", cp);
  if (!placement_.by_documents()) cp::require_dcs_divisible(placement_.global, cp, "hybrid model layout");
  tl_ = placement_.local_rows(comm_.rank());
  if (!groups_) groups_ = (own_groups_ = std::make_unique<ExpertGroups>(comm_, c_.ep)).get();
  HCP_CHECK(groups_->replicas().size() * groups_->size() == cp, "hybrid: the expert groups do not split this CP group");
  std::size_t n_attn = 0;
  for (std::size_t i = 0; i < c_.pattern.size(); ++i) {
    Block b;
    b.kind = c_.pattern[i];
    b.prefix = block_prefix(i);
    switch (b.kind) {
      case 'M':
        b.mamba = make_mamba2(c_.mamba_cp, comm_, c_.mamba, placement_);
        break;
      case '*': {
        const AttnLayerConfig ac = c_.attention_layer(n_attn++);
        std::shared_ptr<CpLevels> levels;
        if (cp::attn_strategy_info(ac.strategy).two_level && cp > 1) {
          cp::check_attention_cp_shape(cp_attn_config(ac, placement_), cp);  // before any group is split
          std::shared_ptr<CpLevels>& l = levels_[ac.cp_inner];
          if (!l) l = CpLevels::make(comm_, ac.cp_inner);
          levels = l;
        }
        b.attn = std::make_unique<AttentionLayer>(comm_, ac, placement_, std::move(levels));
        break;
      }
      case 'E':
        b.moe = std::make_unique<MoeLayer>(groups_->ep(), groups_->replicas(), comm_, c_.moe);
        break;
      default:
        b.mlp = std::make_unique<MlpLayer>(comm_, c_.mlp);
        break;
    }
    blocks_.push_back(std::move(b));
  }
}

std::vector<Tensor> HybridModel::routing() const {
  std::vector<Tensor> out;
  for (const Block& b : blocks_) {
    if (!b.moe) continue;
    const Tensor& sel = b.moe->selection();
    const std::int64_t K = b.moe->topk();
    Tensor t = Tensor::zeros({tl_, K}, DType::F64);
    if (sel.defined() && sel.numel() == tl_ * K && sel.numel() > 0) t.copy_from(sel.view({tl_, K}));
    out.push_back(t);
  }
  return out;
}

void HybridModel::fwd(const ParamMap& p, const std::vector<std::int64_t>& tokens,
                      const std::vector<std::int64_t>& labels, StepResult& r, bool keep) {
  SpaceScope space_scope(p.at("embed").space());  // the model runs where its parameters live
  HCP_CHECK(static_cast<std::int64_t>(tokens.size()) == tl_ && labels.size() == tokens.size(), "hybrid: need ", tl_,
            " local tokens and labels, got ", tokens.size(), " and ", labels.size());
  for (auto t : tokens)
    HCP_CHECK(t >= 0 && t < c_.vocab, "hybrid: token id ", t, " outside [0, model.vocab = ", c_.vocab, ")");
  const DType dt = p.at("embed").dtype();
  const std::int64_t C = c_.hidden;
  tokens_ = tokens;
  labels_ = labels;
  Tensor h = Tensor::zeros({tl_, C}, dt);
  timed("fwd/embed", [&] { k::embedding_fwd(h, p.at("embed"), tokens); });
  outs_.clear();
  fwd_bytes_.clear();
  for (auto& b : blocks_) {
    const std::int64_t sent0 = comm_.bytes_sent();
    timed(std::string("fwd/") + b.kind, [&] {
      b.x = h;
      Tensor n = Tensor::zeros({tl_, C}, dt), m = Tensor::zeros({tl_, C}, dt);
      b.rstd = Tensor::zeros({tl_}, dt);
      k::rmsnorm_fwd(n, b.rstd, h, p.at(b.prefix + "norm"), c_.eps);
      const ParamMap sp = block_params(p, b.prefix);
      if (b.mamba) b.mamba->forward(m, n, sp);
      if (b.attn) b.attn->forward(m, n, sp);
      if (b.moe) b.moe->forward(m, n, sp);
      if (b.mlp) b.mlp->forward(m, n, sp);
      Tensor hn = Tensor::zeros({tl_, C}, dt);
      k::add(hn, h, m);
      h = hn;
      if (!keep) drop_saved(b);
    });
    fwd_bytes_[b.kind] += comm_.bytes_sent() - sent0;
    if (keep) outs_.push_back(h);
  }
  timed("fwd/head", [&] {
    hfinal_ = h;
    hn_ = Tensor::zeros({tl_, C}, dt);
    rstd_final_ = Tensor::zeros({tl_}, dt);
    k::rmsnorm_fwd(hn_, rstd_final_, h, p.at("final_norm"), c_.eps);
    logits_ = Tensor::zeros({tl_, c_.vocab}, dt);
    k::linear_fwd(logits_, hn_, p.at("lm_head"), nullptr);
    std::int64_t cnt = 0;
    const double local = k::cross_entropy_fwd(logits_, labels, c_.ignore_label, &cnt);
    double v[2] = {local, static_cast<double>(cnt)};
    comm_.all_reduce(v, 2, DType::F64, ReduceOp::Sum);
    count_ = static_cast<std::int64_t>(v[1]);
    r.label_tokens = count_;
    r.loss = count_ > 0 ? v[0] / static_cast<double>(count_) : 0.0;
    if (!keep) hfinal_ = hn_ = rstd_final_ = Tensor();  // the logits stay (last_logits)
  });
}

void HybridModel::drop_saved(Block& b) {
  b.x = b.rstd = Tensor();
  if (b.mamba) b.mamba->drop_saved();
  if (b.attn) b.attn->drop_saved();
  if (b.moe) b.moe->drop_saved();
  if (b.mlp) b.mlp->drop_saved();
}

const AttentionLayer& HybridModel::attention(std::size_t j) const {
  std::size_t n = 0;
  for (const Block& b : blocks_)
    if (b.attn && n++ == j) return *b.attn;
  throw Error("hybrid: the pattern has no attention layer " + std::to_string(j));
}

void HybridModel::keep_handoff(bool on) {
  HCP_CHECK(!on || !placement_.by_documents(),
            "generation prefills on a DualChunkSwap placement only (data.partition = \"dcs\")");
  for (Block& b : blocks_) {
    if (b.mamba) b.mamba->keep_carry(on);
    if (b.attn) b.attn->keep_kv(on);
  }
}

Tensor HybridModel::last_logits() {
  HCP_CHECK(logits_.defined(), "hybrid: last_logits() before forward()");
  const SeqLayout real = placement_.global.unpadded();
  const std::vector<std::int64_t> ri = placement_.real_index(comm_.rank());
  std::vector<std::int64_t> dst, src;
  const std::vector<std::int64_t>& cu = real.cu_seqlens;
  for (std::size_t i = 0; i < ri.size(); ++i) {
    if (ri[i] < 0) continue;
    const auto s = std::upper_bound(cu.begin(), cu.end(), ri[i]) - cu.begin() - 1;  // ri[i]'s sequence
    if (ri[i] != cu[static_cast<std::size_t>(s) + 1] - 1) continue;
    dst.push_back(s);
    src.push_back(static_cast<std::int64_t>(i));
  }
  Tensor out = Tensor::zeros({real.nseq(), c_.vocab}, logits_.dtype(), logits_.space());
  if (!dst.empty()) cp::copy_rows(out, logits_, dst, src);
  comm_.all_reduce(out);  // one rank holds each row: the sum is that row, bit for bit
  return out;
}

StepResult HybridModel::forward(const ParamMap& p, const std::vector<std::int64_t>& tokens,
                                const std::vector<std::int64_t>& labels) {
  StepResult r;
  fwd(p, tokens, labels, r, false);
  return r;
}

StepResult HybridModel::step(const ParamMap& p, const std::vector<std::int64_t>& tokens,
                             const std::vector<std::int64_t>& labels, ParamMap& grads) {
  SpaceScope space_scope(p.at("embed").space());  // the model runs where its parameters live
  StepResult r;
  fwd(p, tokens, labels, r, true);
  const DType dt = p.at("embed").dtype();
  const std::int64_t C = c_.hidden;
  // Gradients are made where they are computed (each block's by its layer), not all up front: the
  // peak of the backward then holds the remaining activations and the gradients made so far, and a
  // layer's gradients exist once, not beside a pre-made copy.
  grads.clear();
  const auto grad = [&](const std::string& n) -> Tensor& {
    Tensor& g = grads[n];
    if (!g.defined()) g = Tensor::zeros(p.at(n).shape(), p.at(n).dtype());
    return g;
  };
  Tensor dh = Tensor::zeros({tl_, C}, dt);
  timed("bwd/head", [&] {
    dlogits_ = Tensor::zeros(logits_.shape(), dt);
    k::cross_entropy_bwd(dlogits_, logits_, labels_, c_.ignore_label,
                         count_ > 0 ? 1.0 / static_cast<double>(count_) : 0.0);
    Tensor dhn = Tensor::zeros({tl_, C}, dt);
    k::linear_bwd(&dhn, &grad("lm_head"), nullptr, hn_, p.at("lm_head"), dlogits_);
    k::rmsnorm_bwd(dh, grad("final_norm"), hfinal_, p.at("final_norm"), rstd_final_, dhn);
    release_saved(hfinal_, hn_, rstd_final_);
    reduce_grad(comm_, grads["lm_head"]);
    reduce_grad(comm_, grads["final_norm"]);
  });
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    auto& b = *it;
    timed(std::string("bwd/") + b.kind, [&] {
      const ParamMap sp = block_params(p, b.prefix);
      ParamMap g;
      Tensor dn = Tensor::zeros({tl_, C}, dt);
      if (b.mamba) b.mamba->backward(dn, g, dh, sp);
      if (b.attn) b.attn->backward(dn, g, dh, sp);
      if (b.moe) b.moe->backward(dn, g, dh, sp);
      if (b.mlp) b.mlp->backward(dn, g, dh, sp);
      for (auto& [n, t] : g) grads[b.prefix + n] = t;
      Tensor dx = Tensor::zeros({tl_, C}, dt);
      Tensor& dnorm = grad(b.prefix + "norm");
      k::rmsnorm_bwd(dx, dnorm, b.x, p.at(b.prefix + "norm"), b.rstd, dn);
      release_saved(b.x, b.rstd);
      reduce_grad(comm_, dnorm);
      k::axpy(dh, 1.0, dx);  // residual
    });
  }
  timed("bwd/embed", [&] {
    k::embedding_bwd(grad("embed"), tokens_, dh);
    reduce_grad(comm_, grads["embed"]);
  });
  return r;
}

}  // namespace hcp::model
