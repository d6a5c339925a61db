#include "trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/clock.hpp"
#include "device.hpp"

namespace hcp::drivers {
namespace {
// From the first flipped expert choice the CP run and the replica train slightly different models:
// fp32 runs of inputs/hybrid_nano_like.toml at np 2 stay within 2e-6 until a flip at step 21, then
// drift to 9.7e-4 by step 27.
constexpr double kLossRtolFlipped = 1e-2;
}  // namespace

drivers::PlacedBatch placed_step(const Deck& d, const TrainSetup& s, int rank, std::int64_t t) {
  return drivers::place_batch(d, drivers::step_batch(d, drivers::by_documents(d) ? 1 : s.cp, s.cfg.vocab, t), s.cp,
                              rank, s.cfg);
}

TrainSetup train_setup(const DriverContext& ctx) {
  const Deck& d = ctx.deck;
  TrainSetup s;
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

Trainer::Trainer(DriverContext& ctx)
    : ctx_(ctx),
      d_(ctx.deck),
      s_(train_setup(ctx)),
      grid_(ProcessGrid::make(*ctx.world, s_.cp)),
      cpc_(drivers::device_comm(d_, *grid_.cp, nccl_)),
      with_ref_(d_.get_bool("train.reference")),
      mw_(s_.dt),
      groups_(cpc_, drivers::ep_size_of(d_, s_.cfg, s_.cp)) {
  rtol_ = d_.get_float("train.loss_rtol") > 0 ? d_.get_float("train.loss_rtol") : drivers::train_loss_tolerance(s_.dt);
  rtol_flipped_ = d_.get_float("train.loss_rtol_flipped") > 0 ? d_.get_float("train.loss_rtol_flipped")
                                                              : std::max(rtol_, kLossRtolFlipped);
  steps_ = d_.get_int("train.steps");
  every_ = d_.get_int("train.checkpoint_every");
  stop_after_ = d_.get_int("train.stop_after");
  ck_ = d_.get_string("train.checkpoint");
  resume_ = d_.get_string("train.resume");
  shards_ = model::expert_shards(s_.cfg, groups_);
  owner_ = groups_.replicas().rank() == 0 && grid_.dp_rank == 0;
  const auto seed = static_cast<std::uint64_t>(d_.get_int("data.seed"));
  p_ = drivers::in_space(model::hybrid_init(s_.cfg, mw_.master, seed, &groups_), drivers::space_of(d_));
  opt_ = std::make_unique<model::AdamW>(s_.opt, p_);
  std::set<std::string> split;
  for (const auto& [n, sh] : shards_) split.insert(n);
  opt_->set_split(split, &groups_.ep());
  if (!resume_.empty())
    drivers::read_checkpoint(resume_, p_, *opt_, ts_.loss, with_ref_ ? &ts_.loss_reference : nullptr, shards_);
  if (with_ref_ && ctx.root())
    replica_ =
        std::make_unique<drivers::Replica>(*grid_.self, s_.cfg, mw_, s_.opt, seed, drivers::space_of(d_), resume_);
  start_ = opt_->steps_done();
  HCP_CHECK(start_ < steps_, "train.resume: the checkpoint is at step ", start_, ", not before train.steps = ", steps_);
}

void Trainer::header() const {
  if (!ctx_.root()) return;
  std::printf(
      "# train_hybrid: %s\n",
      drivers::fields("ranks", ctx_.world->size(), "cp", s_.cp, "pattern", s_.cfg.pattern, "hidden", s_.cfg.hidden,
                      "vocab", s_.cfg.vocab, "ep", groups_.size(), "attention", d_.get_string("parallel.attention"),
                      "mamba_cp", d_.get_string("parallel.mamba_cp"), "dtype", to_string(s_.dt), "steps",
                      std::to_string(start_ + 1) + ".." + std::to_string(steps_), "backend",
                      drivers::device_desc(d_, cpc_), "resumed_from", resume_.empty() ? "-" : resume_)
          .c_str());
}

bool Trainer::step(std::int64_t t) {
  const drivers::PlacedBatch pb = placed_step(d_, s_, grid_.cp_rank, t);
  const drivers::TokenBatch& b = pb.batch;
  model::HybridModel m(cpc_, s_.cfg, pb.placement, &groups_);
  model::ParamMap g;
  cpc_.barrier();
  const double t0 = now_seconds();
  const model::StepResult res = m.step(mw_.compute(p_), pb.tokens, pb.labels, g);
  drivers::require_finite("the loss", res.loss, t);  // before the update (the same on every rank)
  mw_.widen(g);
  const double gn = opt_->step(p_, g, model::is_buffer);
  drivers::require_finite("the gradient norm", gn, t);
  const double ms = cpc_.all_reduce_scalar((now_seconds() - t0) * 1e3, ReduceOp::Max);
  ts_.loss.push_back(res.loss);
  ts_.lr.push_back(opt_->last_lr());
  ts_.grad_norm.push_back(gn);
  ts_.label_tokens.push_back(static_cast<double>(res.label_tokens));
  ts_.step_ms.push_back(ms);
  if (const auto& docs = pb.placement.docs) {
    const std::vector<int> g = docs->group_sizes();
    ts_.documents_split.push_back(static_cast<double>(docs->documents_split()));
    ts_.largest_group.push_back(g.empty() ? 0.0 : g.back());
    ts_.work_imbalance.push_back(docs->work_imbalance());
  }
  double rl = 0, flips = 0;
  if (replica_) {
    rl = replica_->step(b);
    ts_.loss_reference.push_back(rl);
  }
  if (with_ref_) {  // collective over the CP group; rank 0 compares with the replica
    const std::vector<Tensor> none;
    flips = drivers::routing_flips(cpc_, drivers::space_of(d_), m.routing(), replica_ ? replica_->routing() : none,
                                   pb.placement, ctx_.root());
    ts_.routing_flips.push_back(flips);
    if (flips > 0 && first_flip_ == 0) first_flip_ = t;
  }
  if (replica_) {
    const double rel = std::abs(res.loss - rl) / std::max(std::abs(rl), 1e-300);
    worst_ = nan_max(worst_, rel / (first_flip_ > 0 ? rtol_flipped_ : rtol_));
  }
  print_step(t, pb, res.loss, rl, flips, gn, ms);
  ++done_here_;
  const bool stop = stop_after_ > 0 && done_here_ >= stop_after_ && t < steps_;
  if ((every_ > 0 && t % every_ == 0) || stop || t == steps_) drivers::require_finite(p_, t);
  if ((every_ > 0 && t % every_ == 0) || stop)
    drivers::write_checkpoint(*ctx_.world, ck_, d_, p_, *opt_, ts_.loss, ts_.loss_reference, shards_, owner_);
  if (stop && ctx_.root())
    std::printf("# stopped after %lld steps; checkpoint %s at step %lld\n", static_cast<long long>(done_here_),
                ck_.c_str(), static_cast<long long>(t));
  return !stop;
}

void Trainer::print_step(std::int64_t t, const drivers::PlacedBatch& pb, double loss, double rl, double flips,
                         double gn, double ms) const {
  if (!ctx_.root()) return;
  std::printf("step %4lld/%lld  loss %.6f", static_cast<long long>(t), static_cast<long long>(steps_), loss);
  if (replica_)
    std::printf("  cp1 %.6f (rel %.1e, flips %.1e)", rl, std::abs(loss - rl) / std::max(std::abs(rl), 1e-300), flips);
  if (const auto& docs = pb.placement.docs)
    std::printf("  documents %lld whole %lld split%s",
                static_cast<long long>(docs->lens.size()) - static_cast<long long>(docs->documents_split()),
                static_cast<long long>(docs->documents_split()), docs->split_groups(" (", ")").c_str());
  std::printf("  lr %.2e  gnorm %.3f  tokens/s %.0f  step %.1f ms\n", opt_->last_lr(), gn,
              static_cast<double>(pb.batch.layout.total()) / (ms * 1e-3), ms);
  std::fflush(stdout);
}

void Trainer::finish() {
  double pass = !with_ref_ || worst_ <= 1 ? 1 : 0;
  ctx_.world->broadcast(&pass, 1, DType::F64, 0);
  if (!ctx_.out.empty()) {
    ResultsWriter w(ctx_.out, *ctx_.world);
    drivers::write_config(w, ctx_, "train_hybrid", drivers::device_desc(d_, cpc_), s_.dt, s_.cp,
                          {{"format", d_.get_string("data.format")},
                           {"strategy", d_.get_string("parallel.attention")},
                           {"attention_layers", drivers::attention_layers(s_.cfg)},
                           {"mamba_cp", d_.get_string("parallel.mamba_cp")},
                           {"pattern", s_.cfg.pattern},
                           {"resumed_from", resume_}});
    drivers::write_train_results(w, *ctx_.world, ts_, p_, shards_, owner_, with_ref_, worst_, rtol_, pass == 1);
    w.finish();
  }
  if (ctx_.root()) {
    const std::vector<double>& loss = ts_.loss;
    std::printf("# loss %.4f -> %.4f over %zu steps", loss.front(), loss.back(), loss.size());
    if (with_ref_ && first_flip_ == 0)
      std::printf("; max |loss - cp1| / cp1 = %.1e (tolerance %.1e; expert choices agree)", worst_ * rtol_, rtol_);
    if (with_ref_ && first_flip_ > 0)
      std::printf(
          "; expert choices first differ at step %lld; |loss - cp1| / cp1 at most %.2f x its tolerance "
          "(%.1e before, %.1e from then)",
          static_cast<long long>(first_flip_), worst_, rtol_, rtol_flipped_);
    std::printf("\nRESULT train_hybrid %s%s%s\n", pass == 1 ? "PASS" : "FAIL",
                ctx_.out.empty() ? "" : " file=", ctx_.out.c_str());
  }
  if (pass != 1)
    throw CheckFailed(
        "the CP loss curve departs from the cp=1 replica beyond train.loss_rtol (train.loss_rtol_flipped once an "
        "expert choice differs)");
}

}  // namespace hcp::drivers
