// HDF5 helpers of the results writer and its manifest: the library version, the reason a call
// failed, and the check that names the file and the object being written.
#pragma once
#include <cerrno>
#include <string>

#include "core/error.hpp"

namespace hcp {

// The HDF5 library this build runs on, e.g. "HDF5 1.10.8 (parallel)".
std::string hdf5_library_version();

// The reason the last HDF5 call failed, as the system said it (errno text, MPI-IO's words, or a
// full file system told by the free space where `file` is written).
std::string h5_reason(const std::string& file = "");

// Checks an HDF5 call made while writing `what` to `file`; a failure names both and the reason.
#define HCP_H5_WRITE(call, file, what)                                                                       \
  ([&]() {                                                                                                   \
    errno = 0;                                                                                               \
    auto hcp_rc_ = (call);                                                                                   \
    if (hcp_rc_ < 0)                                                                                         \
      throw ::hcp::Error(                                                                                    \
          ::hcp::detail::concat("cannot write ", what, " to results file '", file, "': ", h5_reason(file))); \
    return hcp_rc_;                                                                                          \
  }())

}  // namespace hcp
