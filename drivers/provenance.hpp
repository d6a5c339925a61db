// What built a driver and where a run ran: the --version line, and the /config attributes that let a
// result be traced (host, date, ranks, cores, GPUs, library versions, git revision and dirty flag).
#pragma once
#include <map>
#include <string>

#include "comm/communicator.hpp"

namespace hcp::drivers {

// "<driver> (hybridcp V, git R[ dirty], <build type>; MPI ..., HDF5 ..., Kokkos ..., BLAS ..., CUDA ..., NCCL ...)"
std::string version_line(const std::string& driver);
// Attributes for /config, the same on every rank's call (rank 0's host and date, agreed over `world`).
std::map<std::string, std::string> run_provenance(Communicator& world);
// The line that started the run: the launcher's (mpirun, mpiexec, orterun, prterun: its whole
// command, the driver's words included) when it is this process's parent; under srun, the job and
// step beside `own`; else `own`, the driver's words.
std::string launch_line(const std::string& own);

}  // namespace hcp::drivers
