#include "comm/process_grid.hpp"

#include <mpi.h>

namespace hcp {

ProcessGrid ProcessGrid::make(const Communicator& world, int cp_size) {
  const int w = world.size();
  HCP_CHECK(cp_size >= 1, "parallel.cp_size must be >= 1, got ", cp_size);
  HCP_CHECK(w % cp_size == 0, "parallel.cp_size = ", cp_size, " must divide the number of ranks (", w, ")");
  ProcessGrid g;
  g.cp_size = cp_size;
  g.dp_size = w / cp_size;
  g.world = world.split_blocks(w);
  g.cp = world.split_blocks(cp_size);
  g.dp = world.split_strided(cp_size);
  g.self = world.split_blocks(1);
  g.cp_rank = g.cp->rank();
  g.dp_rank = g.dp->rank();
  return g;
}

std::shared_ptr<CpLevels> CpLevels::make(Communicator& cp_comm, int inner) {
  auto l = std::make_shared<CpLevels>();
  l->inner = inner;
  l->inner_comm = &cp_comm.block_of(inner);
  l->outer_comm = &cp_comm.strided_of(inner);
  return l;
}

ExpertGroups::ExpertGroups(Communicator& cp, int ep) : cp_(cp) {
  const int n = cp.size();
  if (ep == 0) ep = n;
  HCP_CHECK(ep >= 1 && n % ep == 0, "parallel.ep = ", ep, " must divide the CP group size (", n, ")");
  // Every rank takes the same branches, so the splits stay collective.
  if (ep != n) ep_own_ = cp.split_blocks(ep);
  if (ep != 1) rep_own_ = cp.split_strided(ep);
}

int node_local_rank(int* local_size) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int r = 0, n = 1;
  MPI_Comm_rank(node, &r);
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  if (local_size) *local_size = n;
  return r;
}

}  // namespace hcp
