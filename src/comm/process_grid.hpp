// Process grid: the world split into CP groups (consecutive ranks), DP groups (same CP rank) and
// EP groups (consecutive ranks of ep_size). Passed explicitly to every layer.
#pragma once
#include <memory>

#include "comm/communicator.hpp"

namespace hcp {

struct ProcessGrid {
  std::unique_ptr<Communicator> world, cp, dp, ep;
  int cp_size = 1, dp_size = 1, ep_size = 1;
  int cp_rank = 0, dp_rank = 0, ep_rank = 0;

  // Throws hcp::Error naming cp_size/ep_size when they do not divide the world size.
  static ProcessGrid make(const Communicator& world, int cp_size, int ep_size = 1);
};

// This process's rank among the ranks of its node (MPI_COMM_TYPE_SHARED over MPI_COMM_WORLD), and
// their number in *local_size: the one way drivers and tests pick a GPU per rank.
int node_local_rank(int* local_size = nullptr);

}  // namespace hcp
