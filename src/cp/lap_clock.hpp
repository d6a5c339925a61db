// Host wall time between laps (MPI_Wtime), for the split of a CP layer's time into compute and
// communication wait. On GPU ranks it measures launch time; the drivers' phase times use CUDA
// events there.
#pragma once
#include <mpi.h>

namespace hcp::cp {

struct LapClock {
  double t0 = MPI_Wtime();
  double lap() {  // seconds since the last lap (or construction)
    const double t = MPI_Wtime(), d = t - t0;
    t0 = t;
    return d;
  }
};

}  // namespace hcp::cp
