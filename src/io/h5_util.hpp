// HDF5 helpers of the results writer and its manifest: the reason a call failed, and the check
// that names the file and the object being written.
#pragma once
#include <cerrno>
#include <string>

#include "core/error.hpp"

namespace hcp {

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

// Writes /checksums into the closed results file `tmp` (shown as `shown` in messages): one line per
// numeric dataset ("/path hex") and per numeric attribute of an object under /summary
// ("/path@name hex"); hex = checksum_values() of the values as doubles in C order.
void write_manifest(const std::string& tmp, const std::string& shown);

}  // namespace hcp
