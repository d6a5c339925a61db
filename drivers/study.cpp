#include "study.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "common.hpp"
#include "core/clock.hpp"
#include "cp/layout.hpp"
#include "device.hpp"
#include "layer_keys.hpp"
#include "overlap.hpp"

namespace hcp::drivers {

double layer_tolerance(DType dt) { return dt == DType::F64 ? 1e-10 : dt == DType::F32 ? 1e-5 : 2e-2; }
double model_tolerance(DType dt) { return dt == DType::F64 ? 1e-10 : dt == DType::F32 ? 2e-4 : 1e-1; }
double train_loss_tolerance(DType dt) { return dt == DType::F64 ? 1e-9 : dt == DType::F32 ? 1e-5 : 5e-2; }

Study::Study(DriverContext& c, std::string name, double (*tolerance)(DType))
    : ctx(c),
      deck(c.deck),
      driver(std::move(name)),
      cp(cp_size_of(c.deck, c.world->size())),
      grid(ProcessGrid::make(*c.world, cp)),
      comm(device_comm(c.deck, *grid.cp, device_comm_)),
      self(*grid.self),
      space(space_of(c.deck)),
      dt(dtype_from_string(c.deck.get_string("data.dtype"))),
      check(check_mode(c.deck) == CheckMode::Reference),
      cross(check_mode(c.deck) == CheckMode::Cross),
      warmup(static_cast<int>(c.deck.get_int("run.warmup"))),
      repeats(static_cast<int>(c.deck.get_int("run.repeats"))),
      tol(tolerance(dt)) {
  if (!ctx.out.empty()) writer_ = std::make_unique<ResultsWriter>(ctx.out, *ctx.world, hdf5_io(deck), save_set(deck));
  t_run0_ = now_seconds();
}

void Study::begin_case(const std::string& name) {
  case_ = name;
  planted_ = false;
  const double now = now_seconds(), el = now - t_run0_;
  const int n = std::max<int>(static_cast<int>(case_names_.size()), cases_begun_ + 1), done = cases_begun_++;
  t_case0_ = now;
  if (done == 0) first_case_t0_ = now;
  if (ctx.quiet || !root() || el < 2.0) return;
  if (done == 0) {
    std::fprintf(stderr, "# %s: case %s (1/%d) after %.1f s of set-up (inputs, cp=1 reference)\n", driver.c_str(),
                 name.c_str(), n, el);
  } else {
    const double per_case = (now - first_case_t0_) / done;
    std::fprintf(stderr, "# %s: case %s (%d/%d); %d done in %.1f s, the run ~%.1f s more\n", driver.c_str(),
                 name.c_str(), done + 1, n, done, now - first_case_t0_, per_case * (n - done));
  }
  std::fflush(stderr);
}

std::string Study::backend() const { return device_desc(deck, comm); }

std::vector<std::string> Study::cases(const Cases& c, std::vector<std::pair<std::string, std::string>>* skipped) {
  memory_ = c.memory;
  return case_names_ = runnable(
             comm, select(deck, c.key, c.all_word, c.all), [&](const std::string& n) { c.make(deck, comm, cp, n); },
             skipped);
}

Samples Study::time(const std::function<void(PhaseTimes&)>& body, const std::function<void()>& before) {
  Samples s;
  PhaseTimes clock;
  step_comm.clear();
  step_comm_equal = true;
  std::map<std::string, CommCounter> first_step;
  const double live0 = memory_start();
  // Progress on long runs: a line to stderr (tables stay clean on stdout) at most every 2 s, on
  // rank 0, unless --quiet. A short run prints none.
  const double t_start = now_seconds();
  double t_last = t_start;
  const int n = warmup + repeats;
  for (int it = 0; it < n; ++it) {
    if (!ctx.quiet && root() && it > 0 && now_seconds() - t_last >= 2.0) {
      // This case's time left by its iterations so far, and the run's: the cases after it as long
      // as this one (set-up and checks aside).
      const double now = now_seconds(), el = now - t_start, left = el / it * (n - it);
      const double whole = (now - t_case0_) + left;
      const int after = std::max(0, static_cast<int>(case_names_.size()) - cases_begun_);
      std::fprintf(stderr, "# %s %s: iteration %d/%d (%s)  elapsed %.1f s  case ~%.1f s more, run ~%.1f s more\n",
                   driver.c_str(), case_.empty() ? "reference" : case_.c_str(), it + 1, n,
                   it < warmup ? "warm-up" : "timed", el, left, left + after * whole);
      std::fflush(stderr);
      t_last = now;
    }
    if (before) before();
    if (it == warmup) comm.reset_counters();
    comm.barrier();
    const double rw0 = ring_wait_seconds(comm);
    const std::map<std::string, CommCounter> c0 = comm.counters();
    clock.reset();
    clock.start_laps(space);
    body(clock);
    const std::map<std::string, double> laps = clock.totals();
    if (it < warmup) continue;
    std::map<std::string, CommCounter> step;
    for (const auto& [op, c] : comm.counters()) {
      const auto b = c0.find(op);
      const CommCounter d = b == c0.end() ? c
                                          : CommCounter{c.calls - b->second.calls, c.bytes_sent - b->second.bytes_sent,
                                                        c.seconds - b->second.seconds};
      if (d.calls > 0) step[op] = d;
    }
    if (it > warmup) {
      bool same = step.size() == first_step.size();
      for (const auto& [op, d] : step) {
        const auto f = first_step.find(op);
        same = same && f != first_step.end() && f->second.calls == d.calls && f->second.bytes_sent == d.bytes_sent;
      }
      step_comm_equal = step_comm_equal && same;
    } else {
      first_step = step;
    }
    for (const auto& [op, d] : step) {
      CommCounter& t = step_comm[op];
      t.calls += d.calls;
      t.bytes_sent += d.bytes_sent;
      t.seconds += d.seconds;
    }
    for (const auto& [phase, ms] : laps) s[phase].push_back(ms);
    s["ring_wait"].push_back((ring_wait_seconds(comm) - rw0) * 1e3);
  }
  memory_stop(live0);
  // Every rank reports the same phases (one that ran none of a phase: zeros), so that the tables
  // and the files' per-rank datasets line up.
  std::vector<std::string> mine;
  for (const auto& [phase, v] : s) mine.push_back(phase);
  for (const std::string& phase : union_over(comm, mine)) s.try_emplace(phase, std::vector<double>(repeats, 0.0));
  return s;
}

double Study::slowest(const std::vector<double>& ms) { return comm.all_reduce_scalar(median(ms), ReduceOp::Max); }

std::int64_t Study::bytes_per_step(const std::vector<std::string>& ops) const {
  std::int64_t b = 0;
  for (const auto& [op, c] : step_comm)
    if (ops.empty() || std::find(ops.begin(), ops.end(), op) != ops.end()) b += c.bytes_sent;
  return b / repeats;
}

void Study::write_timings(const std::string& strategy, const Samples& s) {
  write_memory(strategy);
  if (!writer_) return;
  writer_->comm(step_comm, repeats, step_comm_equal, strategy + "/");
  for (const auto& [phase, v] : s)
    if (phase != "ring_wait") writer_->timings(strategy + "/" + phase, v);
}

double Study::overlap(const std::string& strategy, const Samples& s) {
  const Overlap o = measure_overlap(comm, s.at("ring_wait"), repeats, space);
  if (!o.ring) return -1;
  if (writer_) {
    writer_->timings(strategy + "/ring_exposed", o.exposed_ms);
    writer_->timings(strategy + "/ring_isolated", o.isolated_ms);
  }
  return o.fraction;
}

Study::BytesCheck Study::check_bytes(std::int64_t sent, std::int64_t mine) {
  const auto max_over = [&](double v) { return static_cast<std::int64_t>(comm.all_reduce_scalar(v, ReduceOp::Max)); };
  return {max_over(sent == mine ? 0.0 : 1.0) == 0, max_over(static_cast<double>(sent)),
          max_over(static_cast<double>(mine))};
}

bool Study::verdict(const std::string& strategy, const Errors& e, bool extra) {
  double pass = ((!check && !cross) || e.worst <= tol) && extra ? 1 : 0;
  ctx.world->broadcast(&pass, 1, DType::F64, 0);
  if (writer_ && (check || (cross && !e.rel.empty()))) writer_->summaries(strategy, e.rel, tol);
  return pass == 1;
}

void write_config(ResultsWriter& w, const DriverContext& ctx, const std::string& driver, const std::string& backend,
                  DType dt, int cp, std::map<std::string, std::string> attrs) {
  attrs.merge(std::map<std::string, std::string>(ctx.provenance));
  const auto gpus = attrs.extract("gpus_per_node");  // a count: an integer attribute, below
  attrs.merge(std::map<std::string, std::string>{{"driver", driver},
                                                 {"deck", ctx.deck.text()},
                                                 {"deck_resolved", ctx.deck.resolved()},
                                                 {"command_line", ctx.cmdline},
                                                 {"git_revision", ctx.git_rev},
                                                 {"backend", backend},
                                                 {"host_blas", kernels::host_blas()},
                                                 {"dtype", to_string(dt)}});
  w.config(attrs);
  w.config_int("cp_size", cp);
  w.config_int("world_size", ctx.world->size());
  if (ctx.deck.has("parallel.cp_inner")) w.config_int("cp_inner", cp_inner_of(ctx.deck, cp));  // a2a+p2p, resolved
  // Where it ran: more ranks than cores on a node makes its times no scaling measurement.
  w.config_int("ranks_per_node", ranks_per_node());
  w.config_int("node_cores", static_cast<std::int64_t>(std::thread::hardware_concurrency()));
  if (gpus) w.config_int("gpus_per_node", std::stoll(gpus.mapped()));
}

void Study::config(std::map<std::string, std::string> attrs,
                   const std::vector<std::pair<std::string, std::string>>& skipped) {
  if (!writer_) return;
  if (!skipped.empty()) {
    std::string s;
    for (const auto& [n, why] : skipped) s += (s.empty() ? "" : "; ") + n + ": " + why;
    attrs["skipped"] = s;
  }
  attrs["error_metric"] = norm_wise ? "norm_wise: ||got - ref||_2 / ||ref||_2" : "max: max|got - ref| / max|ref|";
  write_config(*writer_, ctx, driver, backend(), dt, cp, std::move(attrs));
}

void Study::header(const std::string& fields, const std::vector<std::pair<std::string, std::string>>& skipped) {
  if (!root()) return;
  std::printf("# %s: ranks=%d cp=%d %s dtype=%s backend=%s\n", driver.c_str(), ctx.world->size(), cp, fields.c_str(),
              to_string(dt).c_str(), backend().c_str());
  for (const auto& [n, why] : skipped) std::printf("# skipped %s: %s\n", n.c_str(), why.c_str());
}

void Study::run(const Cases& c, const StudyHooks& h) {
  Skipped skipped;
  const std::vector<std::string> names = cases(c, &skipped);
  h.setup(names, skipped);
  Table table(h.columns);
  bool all_pass = true;
  for (const std::string& name : names) {
    begin_case(name);
    std::vector<std::string> row;
    all_pass = h.run_case(name, row) && all_pass;
    table.row(row);
  }
  if (root()) {
    if (h.preamble) h.preamble();
    table.print();
    if (h.notes) h.notes();
  }
  finish(all_pass, h.fail_why);
}

void Study::finish(bool pass, const std::string& why) {
  if (writer_) writer_->finish();
  if (root()) {
    for (const auto& l : mem_lines_) std::printf("%s\n", l.c_str());
    // run.check = "cross" with one case compares nothing: unchecked, as hcp_post.py summary says.
    std::printf("RESULT %s %s%s%s\n", driver.c_str(),
                pass ? (check || (cross && cross_compared_) ? "PASS" : "UNCHECKED") : "FAIL",
                ctx.out.empty() ? "" : " file=", ctx.out.c_str());
    std::fflush(stdout);
  }
  // Every rank ends alike (exit 1), whichever ranks saw the failure.
  if (ctx.world->all_reduce_scalar(pass ? 0.0 : 1.0, ReduceOp::Max) != 0) throw CheckFailed(why);
}

}  // namespace hcp::drivers
