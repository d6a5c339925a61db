// The reason an HDF5 call failed.
#include "io/h5_util.hpp"

#include <hdf5.h>
#include <sys/statvfs.h>

#include <cstdlib>
#include <cstring>

namespace hcp {
namespace {
// The reason the last HDF5 call failed, as the system said it: HDF5's file driver records the errno
// of a failed write in its error stack ("errno = 28, error message = 'No space left on device'").
// Through MPI-IO (collective mode) the stack holds the MPI library's own words instead
// ("MPI error string is 'No space left on device'").
struct Reason {
  int code = 0;
  std::string mpi;
};
herr_t find_errno(unsigned, const H5E_error2_t* e, void* out) {
  auto* r = static_cast<Reason*>(out);
  const char* at = e->desc ? std::strstr(e->desc, "errno = ") : nullptr;
  if (at != nullptr && r->code == 0) r->code = std::atoi(at + 8);
  const char* m = e->desc ? std::strstr(e->desc, "MPI error string is") : nullptr;
  if (m != nullptr && r->mpi.empty()) r->mpi = m + 19;
  return 0;
}
}  // namespace

std::string h5_reason(const std::string& file) {
  Reason r;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, find_errno, &r);
  if (r.code == 0 && !r.mpi.empty()) {
    std::string s = r.mpi;
    s.erase(0, s.find_first_not_of(" :'\""));
    s.erase(s.find_last_not_of(" '\"\n") + 1);
    if (!s.empty()) return s;
  }
  if (r.code == 0) r.code = errno;
  if (r.code == 0 && !file.empty()) {
    // MPI-IO reports a short write without a reason: a full file system is told by its free space.
    const auto slash = file.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
    struct statvfs fs {};
    if (statvfs(dir.c_str(), &fs) == 0 &&
        static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) < 1048576.0)
      return detail::concat(std::strerror(ENOSPC), " (",
                            static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize),
                            " bytes free where it is written)");
  }
  return r.code != 0 ? std::strerror(r.code) : "the HDF5 library refused the call";
}

std::string hdf5_library_version() {
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
#ifdef H5_HAVE_PARALLEL
  const char* par = " (parallel)";
#else
  const char* par = " (serial)";
#endif
  return "HDF5 " + std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel) + par;
}

}  // namespace hcp
