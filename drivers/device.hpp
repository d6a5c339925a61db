// GPU ranks for the drivers (deck key run.device = "host" | "cuda"): device selection by local
// rank, and the CP communicator for device tensors, chosen automatically: NCCL when every rank of
// the node has its own GPU; CUDA IPC when ranks share GPUs and the CP group is on one node; else
// MPI with device buffers staged through host memory (a group over nodes with shared GPUs).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/process_grid.hpp"
#include "io/deck.hpp"
#ifdef HCP_HAVE_CUDA
#include "comm/ipc_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/nccl_communicator.hpp"
#include "kernels/cuda/runtime.hpp"
#endif

namespace hcp::drivers {

inline void add_device_key(DeckSchema& s) {
  s.add_string("run.device", "host",
               "where tensors live: host (Kokkos kernels) or cuda (one GPU per local rank, or shared)",
               {"host", "cuda"});
  s.add_string("run.comm", "auto",
               "communicator of the CP group for device tensors: auto (nccl when every rank has its own GPU, else ipc "
               "when the group is on one node, else mpi), nccl, ipc (CUDA IPC, ranks of one node sharing GPUs) or mpi "
               "(host-staged)",
               {"auto", "nccl", "ipc", "mpi"});
}

inline Space space_of(const Deck& d) { return d.get_string("run.device") == "cuda" ? Space::Cuda : Space::Host; }

// Validate phase: selects this rank's GPU (by local rank) when `want`, or one clear error naming
// `key` (given at `where`: the deck line or --set) when that cannot be honoured.
inline void init_gpu(bool want, const std::string& key, const std::string& where) {
  if (!want) return;
#ifdef HCP_HAVE_CUDA
  HCP_INPUT_CHECK(cuda::device_count() > 0, where, key, " = \"cuda\": no usable GPU on this node (",
                  cuda::unavailable_reason(), ")");
  cuda::init(node_local_rank());
#else
  HCP_INPUT_FAIL(where, key, " = \"cuda\" needs a build with CUDA and NCCL (this build has none)");
#endif
}
inline void init_device(const Deck& d) { init_gpu(space_of(d) == Space::Cuda, "run.device", d.where("run.device")); }

// The communicator the CP group uses for device tensors (run.comm; see its help). Every rank of
// `cp` takes the same choice (the conditions are agreed over it). `owned` keeps the one made here.
inline Communicator& device_comm(const Deck& d, Communicator& cp,
                                 [[maybe_unused]] std::unique_ptr<Communicator>& owned) {
  if (space_of(d) == Space::Host) return cp;
  const std::string want = d.get_string("run.comm");
  if (want == "mpi") return cp;
#ifdef HCP_HAVE_CUDA
  int local = 1;
  node_local_rank(&local);
  const int gpus = cuda::device_count();
  const bool own_gpu = cp.all_reduce_scalar(local <= gpus ? 0.0 : 1.0) == 0.0;
  if (want == "nccl" || (want == "auto" && own_gpu)) {
    HCP_CHECK(own_gpu, "run.comm = \"nccl\" needs one GPU per rank: ", local, " ranks share ", gpus,
              " GPU(s) on a node (use \"ipc\" or \"auto\")");
    owned = std::make_unique<NcclCommunicator>(cp);
    return *owned;
  }
  auto* mpi = dynamic_cast<MpiCommunicator*>(&cp);
  const bool one_node = mpi && IpcCommunicator::possible(mpi->handle());
  if (want == "ipc" || (want == "auto" && one_node)) {
    HCP_CHECK(one_node, "run.comm = \"ipc\" needs the ", cp.size(), " ranks of the CP group on one node, at most 64");
    owned = std::make_unique<IpcCommunicator>(mpi->handle());
    return *owned;
  }
#else
  HCP_CHECK(want == "auto", "run.comm = \"", want, "\" needs a build with CUDA and NCCL (this build has none)");
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
