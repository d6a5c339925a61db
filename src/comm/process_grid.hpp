// The process groups of a run, built here and nowhere else: the world split into CP groups
// (consecutive ranks) and DP groups (same CP rank), and inside a CP group the two levels of
// hierarchical attention CP (CpLevels) and the expert-parallel groups (ExpertGroups). The groups
// inside a CP group are split from the communicator the layers run on, so they are of its kind
// (an NCCL group's are NCCL groups, a CUDA IPC group's IPC groups).
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.hpp"

namespace hcp {

struct ProcessGrid {
  // self: this rank alone (the cp = 1 references and replicas).
  std::unique_ptr<Communicator> world, cp, dp, self;
  int cp_size = 1, dp_size = 1;
  int cp_rank = 0, dp_rank = 0;

  // Throws hcp::Error naming parallel.cp_size unless it divides the world size.
  static ProcessGrid make(const Communicator& world, int cp_size);
};

// The two levels of a2a+p2p over one CP group: inner groups of `inner` consecutive ranks and outer
// groups of the ranks with the same inner rank, their bytes counted into the CP group's: the CP
// group's own cached sub-groups (Communicator::block_of, strided_of), made collectively the first
// time any model asks for that inner size and shared by every model and layer after it.
struct CpLevels {
  int inner = 1;
  Communicator* inner_comm = nullptr;  // owned by the CP group's communicator
  Communicator* outer_comm = nullptr;
  static std::shared_ptr<CpLevels> make(Communicator& cp_comm, int inner);
};

// The expert-parallel layout of a CP group: `ep` groups its ranks (consecutive), `replicas` joins
// the cp/ep ranks that hold the same experts. Collective over the CP group (it splits it); build it
// once and share it between the models of a run.
class ExpertGroups {
 public:
  // Throws naming parallel.ep unless ep (0: cp) divides the CP group size.
  ExpertGroups(Communicator& cp_comm, int ep);
  Communicator& ep() const { return ep_own_ ? *ep_own_ : cp_; }
  Communicator& replicas() const { return rep_own_ ? *rep_own_ : cp_; }
  int size() const { return ep().size(); }
  int rank() const { return ep().rank(); }

 private:
  Communicator& cp_;
  std::unique_ptr<Communicator> ep_own_, rep_own_;
};

// This process's rank among the ranks of its node (MPI_COMM_TYPE_SHARED over MPI_COMM_WORLD), and
// their number in *local_size: the one way drivers and tests pick a GPU per rank.
int node_local_rank(int* local_size = nullptr);

}  // namespace hcp
