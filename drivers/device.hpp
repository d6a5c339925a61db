// GPU ranks for the drivers (deck key run.device = "host" | "cuda"): device selection by local
// rank, and the CP communicator for device tensors, chosen automatically: NCCL when every rank of
// the node has its own GPU, else MPI with host staging (several ranks per GPU, or no NCCL).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/process_grid.hpp"
#include "io/deck.hpp"
#ifdef HCP_HAVE_CUDA
#include "comm/nccl_communicator.hpp"
#include "kernels/cuda/runtime.hpp"
#endif

namespace hcp::drivers {

inline void add_device_key(DeckSchema& s) {
  s.add_string("run.device", "host", "where tensors live: host (Kokkos kernels) or cuda (one GPU per local rank, or shared)",
               {"host", "cuda"});
}

inline Space space_of(const Deck& d) { return d.get_string("run.device") == "cuda" ? Space::Cuda : Space::Host; }

// Validate phase: selects this rank's GPU (by local rank) when `want`, or one clear error naming
// `key` when that cannot be honoured.
inline void init_gpu(bool want, const std::string& key) {
  if (!want) return;
#ifdef HCP_HAVE_CUDA
  HCP_CHECK(cuda::device_count() > 0, key, " = \"cuda\": no usable GPU on this node (", cuda::unavailable_reason(), ")");
  cuda::init(node_local_rank());
#else
  HCP_FAIL(key, " = \"cuda\" needs a build with CUDA and NCCL (this build has none)");
#endif
}
inline void init_device(const Deck& d) { init_gpu(space_of(d) == Space::Cuda, "run.device"); }

// The communicator the CP group uses for device tensors: NCCL over `cp` when each local rank has
// its own GPU, else `cp` itself (MPI, device buffers host-staged). `owned` keeps the NCCL one alive.
inline Communicator& device_comm(const Deck& d, Communicator& cp, [[maybe_unused]] std::unique_ptr<Communicator>& owned) {
  if (space_of(d) == Space::Host) return cp;
#ifdef HCP_HAVE_CUDA
  int local = 1;
  node_local_rank(&local);
  if (local <= cuda::device_count()) {
    owned = std::make_unique<NcclCommunicator>(cp);
    return *owned;
  }
#endif
  return cp;
}

inline std::string device_desc(const Deck& d, const Communicator& c) {
  if (space_of(d) == Space::Host) return "host/" + c.backend();
#ifdef HCP_HAVE_CUDA
  return cuda::device_name() + "/" + c.backend();
#else
  return "cuda/" + c.backend();
#endif
}

}  // namespace hcp::drivers
