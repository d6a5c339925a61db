// The study every CP driver runs, in one place: the process grid and the communicator for
// run.device, the cp=1 reference's own communicator, the timed loop (warm-up, a barrier before each
// iteration, per-phase clocks — CUDA events on GPU ranks — and the median over repeats of the slowest
// rank), the cases a deck's strategy choice names (a case that cannot run this shape is skipped and
// reported when the deck asked for all of them), comparisons with the reference against the tolerance
// table, /config, the run header, the table and RESULT. A driver declares its reference run, its
// cases, the tensors it compares and its byte model.
//
// Study's members are defined in study.cpp (the loop, the byte checks, /config and the verdict),
// study_results.cpp (comparisons with the reference, results and inputs in the file),
// study_placement.cpp (per-document placements), study_memory.cpp (memory per case) and
// study_cross_check.cpp (run.check = "cross" and run.plant_fault).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "byte_model.hpp"
#include "cases.hpp"
#include "comm/communicator.hpp"
#include "comm/process_grid.hpp"
#include "core/phase_times.hpp"
#include "core/seq_layout.hpp"
#include "core/tensor.hpp"
#include "cp/documents.hpp"
#include "cp/placement.hpp"
#include "harness.hpp"
#include "inputs.hpp"
#include "io/results.hpp"
#include "memory_model.hpp"
#include "table.hpp"

namespace hcp::drivers {

// Per-repeat samples of the timed iterations: phase -> ms; "ring_wait" is the time blocked in
// ring_wait per iteration (for the overlap measurement).
using Samples = std::map<std::string, std::vector<double>>;

// Tolerances on max |cp - reference| / max |reference| per tensor (relative to the tensor's largest
// magnitude, so tiny elements do not dominate).
//   layer (one attention or Mamba layer):
//     fp64 1e-10 — the same arithmetic in another summation order; 1e-15..1e-14 is what CP runs give,
//                  the margin covers longer sums at larger shapes;
//     fp32 1e-5  — the same, ~100 fp32 ulps of the largest magnitude;
//     bf16 2e-2  — bf16 values are rounded at other points than in the cp=1 run (per ring step merges,
//                  partial dK/dV sums, chunk-start states, group sums): a few ulps of bf16's 2^-8.
//   model (a stack of blocks, cp_hybrid): fp64 1e-10; fp32 2e-4 — rounding differences compound
//     through the blocks, the router's renormalisation and the loss's reductions.
//   training (train_hybrid, |loss_cp - loss_cp1| / loss_cp1 per step, train.loss_rtol = 0): fp64 1e-9,
//     fp32 1e-5 — the replica's parameters drift apart by rounding over the steps.
double layer_tolerance(DType dt);
double model_tolerance(DType dt);
double train_loss_tolerance(DType dt);

using Skipped = std::vector<std::pair<std::string, std::string>>;  // case, why it does not run

// What a CP driver adds to the study loop (Study::run): `setup` gets the cases that run and the
// skipped ones, and builds the problem, the cp=1 reference, /config, the header and the inputs;
// `run_case` runs one case (its timed loop, checks and records) and fills its table row, returning
// whether it passed; `notes` and `preamble` print lines after and before the table (rank 0);
// `fail_why` is the failure's reason.
struct StudyHooks {
  std::function<void(const std::vector<std::string>& names, const Skipped& skipped)> setup;
  std::vector<std::pair<std::string, int>> columns;
  std::function<bool(const std::string& name, std::vector<std::string>& row)> run_case;
  std::function<void()> notes;
  std::string fail_why;
  std::function<void()> preamble = {};
};

class Study {
  // Declared first: the references below are bound to what these own.
  std::unique_ptr<Communicator> device_comm_;

 public:
  Study(DriverContext& ctx, std::string driver, double (*tolerance)(DType));
  Study(const Study&) = delete;
  Study& operator=(const Study&) = delete;

  DriverContext& ctx;
  const Deck& deck;
  const std::string driver;
  const int cp;
  ProcessGrid grid;
  Communicator& comm;  // the CP group on run.device (NCCL when each local rank has its own GPU)
  Communicator& self;  // this rank alone: the cp=1 reference
  const Space space;
  const DType dt;
  const bool check;  // run.check = "reference": against the unpadded cp=1 problem on rank 0
  const bool cross;  // run.check = "cross": every case against the first, shard by shard
  const int warmup, repeats;
  const double tol;
  // How compare() measures a tensor's error: max|got - ref| / max|ref| (the default), or, with
  // norm_wise, ||got - ref||_2 / ||ref||_2 (bf16 models, where a flipped top-k choice moves a few
  // elements by O(1) while the tensor as a whole agrees). Written to /config as error_metric.
  bool norm_wise = false;
  // Where the batch's rows lie (DualChunkSwap of its layout, or per document): the driver's set-up
  // places it; result(), input() and local_rows() follow it.
  cp::Placement placement;
  // Row of the unpadded problem of each of this rank's rows (-1: a pad).
  std::vector<std::int64_t> local_rows() const;
  // Where a packed (THD) batch's documents lie (per document, or for dcs every document split; work by
  // `cost`): in the results /partition/lengths and /partition/owner (the rank holding each whole,
  // -1 split), per rank /partition/rows (pads included), tokens (real), work (the cost model's), and
  // /partition/pad_tokens; and a "# partition" line. Nothing for BSHD. Collective.
  void record_placement(const cp::DocCost& cost);
  ResultsWriter* out() { return writer_.get(); }
  bool root() const { return ctx.root(); }
  std::string backend() const;

  // The cases of `c` that run on this shape; the skipped ones, with their reasons, in `skipped`.
  std::vector<std::string> cases(const Cases& c, std::vector<std::pair<std::string, std::string>>* skipped);

  // Runs body(laps) warmup + repeats times, a barrier before each; `before` runs untimed ahead of
  // each iteration. The body ends its phases with laps.lap(name) (CUDA events on GPU ranks, wall time
  // on host ranks) and may add figures it measured itself with laps.add(name, ms). step_comm sums the communicator's
  // counters inside the timed bodies only (the barrier, the timing reductions and `before` are not the strategy's
  // traffic).
  Samples time(const std::function<void(PhaseTimes&)>& body, const std::function<void()>& before = {});
  std::map<std::string, CommCounter> step_comm;
  bool step_comm_equal = true;  // every timed step made the same calls with the same bytes
  // Median over repeats, maximum over the CP group (the step time the slowest rank sets).
  double slowest(const std::vector<double>& ms);
  // Bytes sent per timed step by the ops `ops` (all when empty), this rank.
  std::int64_t bytes_per_step(const std::vector<std::string>& ops = {}) const;
  // This rank's bytes `sent` against its model `mine`: ok on every rank, and both maxima over ranks.
  struct BytesCheck {
    bool ok;
    std::int64_t max_sent, max_model;
  };
  BytesCheck check_bytes(std::int64_t sent, std::int64_t mine);
  // /timings/<strategy>/<phase> of every sample but ring_wait, /comm/<strategy>/ of the counters
  // (call before overlap(): its replay adds to the counters) and /memory/<strategy>/ of the last
  // time() call (its line, max over ranks, is printed before RESULT).
  void write_timings(const std::string& strategy, const Samples& s);
  // The phases' tensor high-water of the last time() call (a model's PhaseTimes::peaks()), shown in
  // the case's memory line (the phase where the step's high-water falls) and written beside it,
  // /memory/<strategy>/phase_peak_bytes/<phase>, above the bytes alive before the step. Call before
  // write_timings.
  void phase_memory(const std::map<std::string, PhaseTimes::Peak>& peaks);
  // Parameter elements this rank holds, and of those the routed experts' (EP size ep): a line and
  // /memory/parameters/{bytes,expert_bytes} in the run's dtype.
  void write_parameter_memory(double elements, double expert_elements, int ep);
  // The ring overlap of a strategy's timed iterations (p2p: ring_exposed / ring_isolated written);
  // `fraction` < 0 where it posted no ring exchanges. Collective.
  double overlap(const std::string& strategy, const Samples& s);

  // Errors of one case against the reference (rank 0 compares; the others keep an empty list).
  struct Errors {
    std::vector<std::pair<std::string, double>> rel;
    double worst = 0;
    void add(const std::string& name, double e);
  };
  void compare(Errors& e, const std::string& name, const Tensor& got, const Tensor& ref) const;
  // `local`, perturbed when run.plant_fault names this case (its first result only; result() and
  // cross_compare() apply it themselves, a driver comparing by compare() calls it).
  Tensor planted(const Tensor& local);
  // A CP result [Tl, ...] of this rank (in the placement's order, pads included): gathered into the
  // unpadded order (on every CP rank, only when the run checks) and compared with `ref`; with
  // `pads_zero` every pad row must be zero (entry "<name>_pads": max |pad| / max |ref|, where the
  // placement has pads). Written to `path` as the real tokens in global order, each rank its own
  // rows (the first CP group's), when the file keeps it.
  void result(Errors& e, const std::string& name, const std::string& path, const Tensor& local, const Tensor& ref,
              bool pads_zero, const std::string& layout, const std::string& units);
  // Whether the file keeps the run's inputs (run.save = inputs or all); the same on every rank.
  bool keeps_inputs() const { return writer_ && writer_->save().keeps_class("inputs"); }
  // An input [Tl, ...] of this rank (DualChunkSwap order, pads included), written as result() writes
  // a result: /inputs/<name>, the real tokens in global order. Nothing unless keeps_inputs().
  void input(const std::string& name, const Tensor& local, const std::string& layout, const std::string& units);
  // A tensor every rank holds whole (a parameter), as /inputs/<name>.
  void input_whole(const std::string& name, const Tensor& t, const std::string& layout, const std::string& units);
  // /inputs/cu_seqlens: the sequence starts of the unpadded problem (BSHD: one per batch row).
  void input_layout();
  // run.check = "cross": this rank's shard of result `name` against the first case's shard of it
  // (its real rows only, for `batch_rows`: a tensor of the placement's rows), the worst error
  // reduced over the CP group with one all-reduce; the first case keeps its shards as the baseline.
  // Every rank gets the same entry.
  void cross_compare(Errors& e, const std::string& name, const Tensor& local, bool batch_rows = false);
  // A scalar every rank holds the same (a loss), against the first case's, relative.
  void cross_scalar(Errors& e, const std::string& name, double v);
  // The case whose results follow (run.plant_fault perturbs the named one's first result). On a run
  // that has taken 2 s or more, a progress line on stderr (rank 0, unless --quiet) names the case,
  // what the cases so far took and the run's time left by them.
  void begin_case(const std::string& name);
  // Rank 0's verdict (errors within tolerance and `extra`), agreed by every rank; writes /summary.
  bool verdict(const std::string& strategy, const Errors& e, bool extra = true);

  // /config: driver, deck, command line, revision, format, backend, dtype, cp_size, world_size and
  // `attrs`; the skipped cases, when any, as "skipped".
  void config(std::map<std::string, std::string> attrs,
              const std::vector<std::pair<std::string, std::string>>& skipped = {});
  // "# <driver>: ranks=.. cp=.. <fields> dtype=.. backend=.." (rank 0), and the skipped cases.
  void header(const std::string& fields, const std::vector<std::pair<std::string, std::string>>& skipped = {});
  // Writes the file, prints RESULT and throws `why` when !pass.
  void finish(bool pass, const std::string& why);
  // The study loop: the cases of `c` that run this shape, h.setup, then per case begin_case and
  // h.run_case (every case runs, a failed one too), the table and h.notes on rank 0, and finish().
  void run(const Cases& c, const StudyHooks& h);

 private:
  // The largest magnitude of `t`, and the entry "<name>_pads": max |pad| / max |ref|.
  static double max_abs(const Tensor& t);
  void pad_error(Errors& e, const std::string& name, double max_pad, const Tensor& ref) const;
  // `local` [Tl, ...] (DCS order, pads included) as the real tokens in global order at `path`, each
  // rank its own rows (the first CP group's).
  void write_real_rows(const std::string& path, const Tensor& local, const std::string& layout,
                       const std::string& units);
  std::unique_ptr<ResultsWriter> writer_;
  // Memory of this rank over the last time() call: tensor storage allocated beyond what was alive
  // when it began (the case's working set: activations, exchange buffers, workspace) and what was
  // alive then (inputs, outputs, reference), in the run's memory space; the process's host RSS
  // high-water; on GPU ranks the device's used memory and the high-water of the stream-ordered pool.
  struct Memory {
    double work = 0, live = 0, rss_peak = 0, device_used = 0, pool_peak = 0;
    std::map<std::string, PhaseTimes::Peak> phases;  // bytes above `live`
  } mem_;
  std::vector<std::string> mem_lines_;   // "# memory per rank" lines printed by finish()
  std::map<std::string, Tensor> first_;  // run.check = "cross": the first case's shards
  std::map<std::string, double> first_scalar_;
  std::string case_;
  std::vector<std::string> case_names_;  // the cases that run (cases()), for progress lines
  int cases_begun_ = 0;
  double t_run0_ = 0, t_case0_ = 0,
         first_case_t0_ = 0;  // now_seconds() at the study's start, the case's, the first case's
  bool planted_ = false;
  bool cross_compared_ = false;  // run.check = "cross": some case was compared with the first
  // The cases' memory model (Cases::memory), shown beside the measured high-water of each case.
  std::function<MemoryModel(const Deck&, int, const std::string&)> memory_;
  double memory_start();                           // resets the high-water marks; the bytes alive now
  void memory_stop(double live0);                  // fills mem_
  void write_memory(const std::string& strategy);  // its line, and /memory/<strategy>/ when writing
};

// /config of any driver: driver, deck, resolved deck, command line, revision, backend, dtype,
// cp_size, world_size and `attrs`.
void write_config(ResultsWriter& w, const DriverContext& ctx, const std::string& driver, const std::string& backend,
                  DType dt, int cp, std::map<std::string, std::string> attrs);

// The union over the ranks of `comm` of every rank's names, sorted (collective).
std::vector<std::string> union_over(Communicator& comm, const std::vector<std::string>& names);

}  // namespace hcp::drivers
