#include "comm/process_grid.hpp"

namespace hcp {

ProcessGrid ProcessGrid::make(const Communicator& world, int cp_size, int ep_size) {
  const int w = world.size(), r = world.rank();
  HCP_CHECK(cp_size >= 1, "parallel.cp_size must be >= 1, got ", cp_size);
  HCP_CHECK(ep_size >= 1, "parallel.ep_size must be >= 1, got ", ep_size);
  HCP_CHECK(w % cp_size == 0, "parallel.cp_size = ", cp_size, " must divide the number of ranks (", w, ")");
  HCP_CHECK(w % ep_size == 0, "parallel.ep_size = ", ep_size, " must divide the number of ranks (", w, ")");
  ProcessGrid g;
  g.cp_size = cp_size;
  g.ep_size = ep_size;
  g.dp_size = w / cp_size;
  g.world = world.split(0, r);
  g.cp = world.split(r / cp_size, r);
  g.dp = world.split(r % cp_size, r);
  g.ep = world.split(r / ep_size, r);
  g.cp_rank = g.cp->rank();
  g.dp_rank = g.dp->rank();
  g.ep_rank = g.ep->rank();
  return g;
}

}  // namespace hcp
