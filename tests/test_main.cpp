// One GoogleTest main for every test binary: MPI -> Kokkos -> gtest. Non-root ranks print only
// failures (prefixed with their rank); the exit status is the maximum over ranks, or 77 (CTest's
// "skipped", SKIP_RETURN_CODE) when every test that ran was skipped, e.g. GPU tests without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>

namespace {
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::initialize(argc, argv);
    testing::InitGoogleTest(&argc, argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) {
      auto& listeners = testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(rank));
      if (GTEST_FLAG_GET(list_tests)) (void)std::freopen("/dev/null", "w", stdout);
    }
    int local = RUN_ALL_TESTS();
    MPI_Allreduce(&local, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const auto* ut = testing::UnitTest::GetInstance();
    if (rc == 0 && ut->test_to_run_count() > 0 && ut->skipped_test_count() == ut->test_to_run_count()) rc = 77;
    Kokkos::finalize();
  }
  MPI_Finalize();
  return rc;
}
