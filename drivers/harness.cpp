#include "harness.hpp"

#include <mpi.h>

#include <unistd.h>
#include <Kokkos_Core.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cases.hpp"
#include "comm/mpi_communicator.hpp"
#include "common.hpp"
#include "core/error.hpp"
#include "layer_keys.hpp"
#include "provenance.hpp"

#ifndef HCP_GIT_REV
#define HCP_GIT_REV "unknown"
#endif

namespace hcp {

int DriverContext::node_ranks() const {
  if (ranks > 0) return ranks_per_node > 0 ? std::min(ranks_per_node, ranks) : ranks;
  int local = 1;
  node_local_rank(&local);
  return local;
}

bool agree_on_errors(Communicator& comm, const std::function<void()>& fn, std::string* message, bool print) {
  std::string msg;
  double failed = 0;
  try {
    fn();
  } catch (const std::exception& e) {
    msg = e.what();
    failed = 1;
  }
  // Lowest failing rank (size() when none).
  double first = failed ? comm.rank() : comm.size();
  first = -comm.all_reduce_scalar(-first, ReduceOp::Max);
  if (first >= comm.size()) return true;
  // Ship that rank's message to rank 0 (fixed-size buffer keeps it one collective).
  std::vector<double> len(1, static_cast<double>(msg.size()));
  const int src = static_cast<int>(first);
  comm.broadcast(len.data(), 1, DType::F64, src);
  std::string text(static_cast<std::size_t>(len[0]), ' ');
  if (comm.rank() == src) text = msg;
  std::vector<float> buf(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) buf[i] = static_cast<float>(static_cast<unsigned char>(text[i]));
  if (!buf.empty()) comm.broadcast(buf.data(), static_cast<std::int64_t>(buf.size()), DType::F32, src);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(static_cast<unsigned char>(buf[i]));
  if (message) *message = text;
  if (print && comm.rank() == 0) std::fprintf(stderr, "error: %s\n", text.c_str());
  return false;
}

void check_output_path(const std::string& out, const std::string& where) {
  namespace fs = std::filesystem;
  std::error_code ec;
  HCP_INPUT_CHECK(!fs::is_directory(out, ec), where, "is a directory (give a file name)");
  const fs::path dir = fs::path(out).has_parent_path() ? fs::path(out).parent_path() : fs::path(".");
  HCP_INPUT_CHECK(fs::is_directory(dir, ec), where, "folder '", dir.string(), "' does not exist");
  HCP_INPUT_CHECK(::access(dir.c_str(), W_OK) == 0, where, "folder '", dir.string(), "' is not writable (",
                  std::strerror(errno), ")");
}

int run_driver(int argc, char** argv, const DriverSpec& spec) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    // Kokkos sees only its own --kokkos-* options: --help and --version are the driver's.
    std::vector<char*> kargs{argv[0]};
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]).rfind("--kokkos", 0) == 0) kargs.push_back(argv[i]);
    int kargc = static_cast<int>(kargs.size());
    Kokkos::initialize(kargc, kargs.data());
    {
      MpiCommunicator world(MPI_COMM_WORLD);
      drivers::ranks_per_node();  // collective once, on every rank, before any deck-dependent code asks
      DriverContext ctx;
      ctx.world = &world;
      ctx.provenance = drivers::run_provenance(world);  // collective: rank 0's host and date everywhere
      ctx.git_rev = HCP_GIT_REV;
      ctx.driver = spec.name;
      for (int i = 0; i < argc; ++i) ctx.cmdline += (i ? " " : "") + std::string(argv[i]);
      ctx.cmdline = drivers::launch_line(ctx.cmdline);  // rank 0's is the file's (mpirun's line where it launched)

      bool exit_now = false;
      bool ok = agree_on_errors(world, [&] { exit_now = prepare_driver(argc, argv, spec, ctx); });
      if (!ok) {
        status = 2;
      } else if (!exit_now) {
        try {
          spec.run(ctx);
        } catch (const CheckFailed& e) {
          if (world.rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
          std::fflush(stderr);
          status = 1;
        } catch (const std::exception& e) {
          // After run.memory_check = "warn" let refused sizes run, the error opens with where they came from.
          const std::string msg = ctx.memory_warned.empty() ? e.what()
                                                            : drivers::from_input(ctx.memory_warned, e.what()) +
                                                                  " (run.memory_check = \"warn\" ran sizes the "
                                                                  "memory model does not fit on a rank)";
          std::fprintf(stderr, "[rank %d] error: %s\n", world.rank(), msg.c_str());
          std::fflush(stderr);
          MPI_Abort(MPI_COMM_WORLD, 3);
        }
      }
    }
    Kokkos::finalize();
  }
  MPI_Finalize();
  return status;
}

}  // namespace hcp
