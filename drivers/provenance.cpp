#include "provenance.hpp"

#include <mpi.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io/h5_util.hpp"
#include "kernels/kernels.hpp"
#ifdef HCP_HAVE_CUDA
#include "comm/nccl_communicator.hpp"
#include "kernels/cuda/runtime.hpp"
#endif

namespace hcp::drivers {
namespace {

std::string mpi_library() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int n = 0;
  MPI_Get_library_version(v, &n);
  std::string s(v, static_cast<std::size_t>(n));
  const auto cut = s.find_first_of(",\n");  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  return cut == std::string::npos ? s : s.substr(0, cut);
}

std::string kokkos() {
  const int v = KOKKOS_VERSION;
  return "Kokkos " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         " " + Kokkos::DefaultExecutionSpace::name();
}

std::string libraries() {
  std::string s = mpi_library() + ", " + hdf5_library_version() + ", " + kokkos() + ", BLAS " + kernels::host_blas();
#ifdef HCP_HAVE_CUDA
  s += ", " + cuda::versions() + ", " + nccl_version();
#else
  s += ", no CUDA";
#endif
  return s;
}

std::string git() { return std::string(HCP_GIT_REV) + (HCP_GIT_DIRTY ? " dirty" : ""); }

// A string of rank 0, on every rank.
std::string from_root(Communicator& world, std::string s) {
  double n = world.rank() == 0 ? static_cast<double>(s.size()) : 0.0;
  world.broadcast(&n, 1, DType::F64, 0);
  s.resize(static_cast<std::size_t>(n));
  std::vector<double> buf(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) buf[i] = static_cast<unsigned char>(s[i]);
  if (!buf.empty()) world.broadcast(buf.data(), static_cast<std::int64_t>(buf.size()), DType::F64, 0);
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(static_cast<int>(buf[i]));
  return s;
}

}  // namespace

std::string version_line(const std::string& driver) {
  const std::string type = HCP_BUILD_TYPE;
  return driver + " (hybridcp " HCP_VERSION ", git " + git() + ", " + (type.empty() ? "no build type" : type) + "; " +
         libraries() + ")";
}

std::string launch_line(const std::string& own) {
  std::ifstream in("/proc/" + std::to_string(getppid()) + "/cmdline", std::ios::binary);
  std::vector<std::string> words;
  for (std::string w; std::getline(in, w, '\0');) words.push_back(w);
  if (!words.empty()) {
    const std::string exe = std::filesystem::path(words[0]).filename().string();
    if (exe == "mpirun" || exe == "mpiexec" || exe == "orterun" || exe == "prterun") {
      std::string line;
      for (const std::string& w : words)
        line += (line.empty() ? "" : " ") + (w.find_first_of(" \t'\"") == std::string::npos ? w : "'" + w + "'");
      return line;
    }
  }
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  if (job && step)
    return "srun (job " + std::string(job) + " step " + step + ", " + (tasks ? tasks : "?") + " tasks) " + own;
  return own;
}

std::map<std::string, std::string> run_provenance(Communicator& world) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  char date[32] = {0};
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  int gpus = 0;
#ifdef HCP_HAVE_CUDA
  gpus = cuda::device_count();
#endif
  return {{"host", from_root(world, host)},
          {"date", from_root(world, date)},
          {"git_dirty", HCP_GIT_DIRTY ? "yes" : "no"},
          {"build_type", HCP_BUILD_TYPE},
          {"libraries", libraries()},
          {"gpus_per_node", std::to_string(gpus)}};  // written as an integer (write_config)
}

}  // namespace hcp::drivers
