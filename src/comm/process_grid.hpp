// Process grid: the world split into CP groups (consecutive ranks) and DP groups (same CP rank).
// Expert parallelism runs inside a CP group (model::ExpertGroups, parallel.ep).
#pragma once
#include <memory>

#include "comm/communicator.hpp"

namespace hcp {

struct ProcessGrid {
  std::unique_ptr<Communicator> world, cp, dp;
  int cp_size = 1, dp_size = 1;
  int cp_rank = 0, dp_rank = 0;

  // Throws hcp::Error naming parallel.cp_size unless it divides the world size.
  static ProcessGrid make(const Communicator& world, int cp_size);
};

// This process's rank among the ranks of its node (MPI_COMM_TYPE_SHARED over MPI_COMM_WORLD), and
// their number in *local_size: the one way drivers and tests pick a GPU per rank.
int node_local_rank(int* local_size = nullptr);

}  // namespace hcp
