// train_hybrid's files: checkpoints (parameters, AdamW moments, step and the loss history under
// /checkpoint/, written collectively and read back on every rank) and the per-step series and final
// parameters of the results file (/train/*, /params/*).
#pragma once
#include <cmath>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "hybrid_common.hpp"
#include "io/deck.hpp"
#include "io/results.hpp"
#include "model/optim.hpp"

namespace hcp::drivers {

// A non-finite loss or gradient norm ends the run at that step: nothing after it could be compared,
// and a checkpoint of it could not be resumed.
inline void require_finite(const char* what, double v, std::int64_t step) {
  HCP_CHECK(std::isfinite(v), "step ", step, ": ", what, " is ", v,
            " (not finite); lower train.lr or enable train.clip");
}

// Parameters are checked where they leave the run (checkpoint, results): an update can overflow
// them while the loss and gradient norm of its step were finite.
inline void require_finite(const model::ParamMap& p, std::int64_t step) {
  for (const auto& [n, t] : p) {
    const Tensor h = t.to(Space::Host);
    for (std::int64_t i = 0; i < h.numel(); ++i)
      HCP_CHECK(std::isfinite(h.get(i)), "step ", step, ": parameter '", n, "' element ", i, " is ", h.get(i),
                " (not finite) after the update; lower train.lr or enable train.clip");
  }
}

// Checkpoints prove themselves: /checkpoint carries the resolved deck of the run that wrote it
// ("deck_resolved") and one checksum per dataset ("checksums": lines "<path> <16 hex digits>").
// The routed experts' parameters and moments are split over ranks (`shards`): each part is written
// by its owner (`owner`: this rank's copy is the one written) into the whole dataset, so a checkpoint
// holds every parameter whole and loads at any rank count and EP size.
inline void write_checkpoint(Communicator& world, const std::string& path, const Deck& deck, model::ParamMap& p,
                             model::AdamW& opt, const std::vector<double>& loss, const std::vector<double>& ref_loss,
                             const model::ShardMap& shards, bool owner) {
  ResultsWriter w(path, world);
  std::string sums;
  const auto put = [&](const std::string& name, const Tensor& t, const std::string& layout, const std::string& units) {
    w.tensor(name, t, layout, units);
    if (world.rank() == 0) sums += name + " " + checksum(t) + "\n";
  };
  const auto vec = [](const std::vector<double>& v) {
    return Tensor::from(v, {static_cast<std::int64_t>(v.size())}, DType::F64);
  };
  put("/checkpoint/step", Tensor::from({static_cast<double>(opt.steps_done())}, {1}, DType::F64), "scalar", "steps");
  write_params(w, world, "/checkpoint/params/", p, shards, owner, "parameter shape", &sums);
  write_params(w, world, "/checkpoint/adam_m/", opt.m(), shards, owner, "parameter shape", &sums);
  write_params(w, world, "/checkpoint/adam_v/", opt.v(), shards, owner, "parameter shape", &sums);
  put("/checkpoint/loss", vec(loss), "[step]", "nats");
  if (!ref_loss.empty()) put("/checkpoint/loss_reference", vec(ref_loss), "[step]", "nats");
  w.attribute("/checkpoint", "deck_resolved", deck.resolved());
  w.attribute("/checkpoint", "checksums", sums);
  w.finish();
}

// Keys a resumed run may change (how long it runs, where it checkpoints, how it is checked, the rank
// count); every other key changes the run, so it must be the checkpoint's.
inline bool resume_may_change(const std::string& k) {
  return k == "train.steps" || k == "train.resume" || k == "train.checkpoint" || k == "train.checkpoint_every" ||
         k == "train.stop_after" || k == "train.reference" || k == "train.loss_rtol" || k == "parallel.cp_size" ||
         k == "parallel.ep";
}
inline std::string deck_value(const Deck& d, const DeckKey& k) {
  switch (k.type) {
    case DeckKey::Type::Int:
      return std::to_string(d.get_int(k.key));
    case DeckKey::Type::Float: {
      std::ostringstream os;
      os.precision(17);
      os << d.get_float(k.key);
      return os.str();
    }
    case DeckKey::Type::String:
      return "\"" + d.get_string(k.key) + "\"";
    case DeckKey::Type::Bool:
      return d.get_bool(k.key) ? "true" : "false";
  }
  return "";
}

// Before any work: the checkpoint at `path` is whole (every dataset matches its checksum) and was
// written by a run with the same values of every key that changes the run. The datasets are shared
// out: rank r of n reads and checks those of index r, r + n, ... (the harness agrees on any rank's
// error), so each is read once, not once per rank.
// Also: every dataset the resume reads is among the checksummed ones (the model's parameters and
// moments, step, loss, and loss_reference when train.reference is on), and the series are as long
// as the step count.
inline void check_resume(const std::string& path, const DeckSchema& schema, const Deck& deck,
                         const std::vector<std::string>& params, int rank = 0, int nranks = 1) {
  std::optional<ResultsReader> opened;
  try {
    opened.emplace(path);
  } catch (const Error&) {
    HCP_INPUT_FAIL(deck.where("train.resume"), "train.resume: '", path,
                   "' is not a train_hybrid checkpoint (not an HDF5 file, or its header is damaged)");
  }
  ResultsReader& r = *opened;
  HCP_INPUT_CHECK(r.exists("/checkpoint/step"), deck.where("train.resume"), "train.resume: '", path,
                  "' is not a train_hybrid checkpoint (no /checkpoint/step)");
  std::string sums, text;
  try {
    sums = r.string_attr("/checkpoint", "checksums");
    text = r.string_attr("/checkpoint", "deck_resolved");
  } catch (const Error&) {
    HCP_INPUT_FAIL(deck.where("train.resume"), "train.resume: checkpoint '", path,
                   "' carries no checksums or deck (not written by this version, or damaged)");
  }
  std::istringstream in(sums);
  std::string name, want;
  int n = 0;
  while (in >> name >> want) {
    if (n++ % nranks != rank) continue;
    std::string got;
    try {
      got = checksum(r.read(name));
    } catch (const Error&) {
      got = "(unreadable)";
    }
    HCP_INPUT_CHECK(got == want, deck.where("train.resume"), "train.resume: checkpoint '", path,
                    "' is damaged: dataset ", name, " fails its checksum (", got, " != ", want, ")");
  }
  HCP_INPUT_CHECK(n > 0, deck.where("train.resume"), "train.resume: checkpoint '", path, "' lists no datasets");
  std::set<std::string> listed;
  {
    std::istringstream all(sums);
    while (all >> name >> want) listed.insert(name);
  }
  const bool with_ref = deck.get_bool("train.reference");
  std::vector<std::string> needed{"/checkpoint/step", "/checkpoint/loss"};
  if (with_ref) needed.push_back("/checkpoint/loss_reference");
  for (const auto& pn : params)
    for (const char* part : {"params", "adam_m", "adam_v"})
      needed.push_back(std::string("/checkpoint/") + part + "/" + pn);
  for (const auto& nd : needed) {
    if (listed.count(nd)) continue;
    if (nd == "/checkpoint/loss_reference")
      HCP_INPUT_FAIL(deck.where("train.reference"), "train.resume: train.reference = true, but checkpoint '", path,
                     "' holds no /checkpoint/loss_reference (it was written without the replica): resume with "
                     "train.reference = false");
    HCP_INPUT_FAIL(deck.where("train.resume"), "train.resume: checkpoint '", path, "' is damaged: dataset ", nd,
                   " that the resume reads is missing or not checksummed");
  }
  const auto step = static_cast<std::int64_t>(r.read("/checkpoint/step").get(0));
  const auto series_ok = [&](const char* ds) { return r.read(ds).numel() == step; };
  HCP_INPUT_CHECK(series_ok("/checkpoint/loss") && (!with_ref || series_ok("/checkpoint/loss_reference")),
                  deck.where("train.resume"), "train.resume: checkpoint '", path, "' is damaged: its loss series are ",
                  "not ", step, " steps long");
  HCP_INPUT_CHECK(step < deck.get_int("train.steps"), deck.where("train.steps"), "train.resume: checkpoint '", path,
                  "' is at step ", step, ", not before train.steps = ", deck.get_int("train.steps"));
  const Deck then = Deck::parse(schema, text, path + ":/checkpoint/deck_resolved");
  for (const DeckKey& k : schema.keys()) {
    if (resume_may_change(k.key)) continue;
    const std::string a = deck_value(then, k), b = deck_value(deck, k);
    HCP_INPUT_CHECK(a == b, deck.where(k.key), "train.resume: key '", k.key, "' = ", b, " but checkpoint '", path,
                    "' was written with ", a, " (a resumed run keeps every key that changes the run; it may change ",
                    "train.steps, the checkpoint keys, train.reference/loss_rtol, the rank count and parallel.ep)");
  }
}

// Loads this rank's part of every parameter and moment (`shards`: the split ones' rows; the others whole).
inline void read_checkpoint(const std::string& path, model::ParamMap& p, model::AdamW& opt, std::vector<double>& loss,
                            std::vector<double>* ref_loss, const model::ShardMap& shards = {}) {
  ResultsReader r(path);
  const auto step = static_cast<std::int64_t>(r.read("/checkpoint/step").get(0));
  for (auto& [n, t] : p) {
    const auto it = shards.find(n);
    const auto load = [&](Tensor& dst, const std::string& name) {
      const Tensor got = it == shards.end() ? r.read(name, dst.dtype())
                                            : r.read_rows(name, it->second.first, it->second.rows, dst.dtype());
      HCP_CHECK(got.numel() == dst.numel(), "train.resume: ", name, " in '", path, "' has ", got.numel(),
                " elements, the model's parameter ", shape_str(dst.shape()));
      dst.copy_from(got.view(dst.shape()));
    };
    load(t, "/checkpoint/params/" + n);
    load(opt.m().at(n), "/checkpoint/adam_m/" + n);
    load(opt.v().at(n), "/checkpoint/adam_v/" + n);
  }
  opt.set_steps_done(step);
  loss = r.read("/checkpoint/loss").to_vector();
  if (ref_loss && r.exists("/checkpoint/loss_reference")) *ref_loss = r.read("/checkpoint/loss_reference").to_vector();
}

struct TrainSeries {
  std::vector<double> loss, loss_reference;                  // every step since step 1 (a resumed run continues them)
  std::vector<double> lr, grad_norm, label_tokens, step_ms;  // this run's steps
  // This run's steps, with the replica: the fraction of (real token, MoE block) expert sets unlike the replica's.
  std::vector<double> routing_flips;
  // This run's steps, per document (data.partition = documents or groups): the documents split, the
  // largest block of ranks one runs over (0: none split) and the work's max / mean over the ranks.
  std::vector<double> documents_split, largest_group, work_imbalance;
};
inline void write_train_results(ResultsWriter& w, Communicator& world, const TrainSeries& s, const model::ParamMap& p,
                                const model::ShardMap& shards, bool owner, bool with_ref, double worst, double rtol,
                                bool pass) {
  auto vec = [](const std::vector<double>& v) {
    return Tensor::from(v, {static_cast<std::int64_t>(v.size())}, DType::F64);
  };
  w.tensor("/train/loss", vec(s.loss), "[step] (all steps since step 1)", "nats");
  if (with_ref) {
    w.tensor("/train/loss_reference", vec(s.loss_reference), "[step] cp=1 replica", "nats");
    w.summary("train/loss", worst, worst, rtol, pass);
    w.tensor("/train/routing_flips", vec(s.routing_flips),
             "[step] (this run) fraction of (token, MoE block) expert sets unlike the replica's", "1");
  }
  w.tensor("/train/lr", vec(s.lr), "[step] (this run)", "1");
  w.tensor("/train/grad_norm", vec(s.grad_norm), "[step] (this run), before clipping", "1");
  w.tensor("/train/label_tokens", vec(s.label_tokens), "[step] (this run)", "tokens");
  if (!s.documents_split.empty()) {
    w.tensor("/train/documents_split", vec(s.documents_split), "[step] (this run) documents split over ranks",
             "documents");
    w.tensor("/train/largest_group", vec(s.largest_group),
             "[step] (this run) the largest block of ranks a split document runs over, 0: none", "ranks");
    w.tensor("/train/work_imbalance", vec(s.work_imbalance),
             "[step] (this run) max / mean of the ranks' work by the placement's cost model", "1");
  }
  w.timings("train/step", s.step_ms);
  write_params(w, world, "/params/", p, shards, owner, "parameter shape (final)");
}

}  // namespace hcp::drivers
