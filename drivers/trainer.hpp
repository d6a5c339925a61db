// train_hybrid's parts: a run's sizes from the deck, the batch of each step, and the trainer (the
// model, the optimizer, the cp=1 replica, the steps, the results and the verdict).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "common.hpp"
#include "hybrid_common.hpp"
#include "study.hpp"
#include "train_io.hpp"
#include "train_replica.hpp"

namespace hcp::drivers {

// A training run's sizes: CP size, dtype, the model and the optimizer, from the deck.
struct TrainSetup {
  int cp = 1;
  DType dt = DType::F64;
  model::HybridConfig cfg;
  model::AdamWConfig opt;
};

// The batch of step t as data.partition lays it out, and this rank's tokens.
PlacedBatch placed_step(const Deck& d, const TrainSetup& s, int rank, std::int64_t t);
// From the deck; checks its data sizes against the CP size.
TrainSetup train_setup(const DriverContext& ctx);

// One training run: the model, optimizer and replica set up from the deck (resumed from a checkpoint
// when train.resume names one), then the steps, then the results and the verdict.
class Trainer {
 public:
  explicit Trainer(DriverContext& ctx);
  std::int64_t start() const { return start_; }
  std::int64_t steps() const { return steps_; }
  void header() const;
  // Step t: the CP step and the update, the replica's step and the comparison, the step line;
  // false after the last step this run makes (train.stop_after), with its checkpoint written.
  bool step(std::int64_t t);
  void finish();

 private:
  void print_step(std::int64_t t, const PlacedBatch& pb, double loss, double rl, double flips, double gn,
                  double ms) const;
  DriverContext& ctx_;
  const Deck& d_;
  const TrainSetup s_;
  ProcessGrid grid_;
  std::unique_ptr<Communicator> nccl_;
  Communicator& cpc_;
  const bool with_ref_;
  double rtol_ = 0, rtol_flipped_ = 0;
  std::int64_t steps_ = 0, every_ = 0, stop_after_ = 0, start_ = 0;
  std::string ck_, resume_;
  const MasterWeights mw_;  // master weights, AdamW moments and the update; the model steps in s_.dt
  // Each rank holds its EP rank's experts (parameters, gradients, moments); the replica all of them.
  ExpertGroups groups_;
  model::ShardMap shards_;
  bool owner_ = false;  // writes its experts' rows
  model::ParamMap p_;   // on run.device, as the gradients and the optimizer state
  std::unique_ptr<model::AdamW> opt_;
  TrainSeries ts_;
  std::unique_ptr<Replica> replica_;  // rank 0
  double worst_ = 0;                  // relative loss difference: the largest, in units of its step's tolerance
  std::int64_t first_flip_ = 0;       // the first step whose expert choices differ from the replica's (0: none)
  std::int64_t done_here_ = 0;
};

}  // namespace hcp::drivers
