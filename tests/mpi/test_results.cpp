// HDF5 results: write from every rank count, read back bit for bit; abandoned files are removed.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "comm/mpi_communicator.hpp"
#include "io/results.hpp"

using namespace hcp;
namespace fs = std::filesystem;

namespace {
std::string tmp_path(MpiCommunicator& c, const std::string& stem) {
  double pid = c.rank() == 0 ? static_cast<double>(getpid()) : 0;
  c.broadcast(&pid, 1, DType::F64, 0);
  return (fs::temp_directory_path() / (stem + "-" + std::to_string(static_cast<long>(pid)) + ".h5")).string();
}
}  // namespace

TEST(Results, RoundTripBitForBit) {
  MpiCommunicator c(MPI_COMM_WORLD);
  const std::string path = tmp_path(c, "hcp-roundtrip");
  Tensor a = Tensor::empty({3, 5, 2}, DType::F64), b = Tensor::empty({7}, DType::F32);
  fill_uniform(a, 1);
  fill_uniform(b, 2);
  {
    ResultsWriter w(path, c);
    w.config({{"strategy", "p2p"}, {"deck", "[model]\nheads = 4\n"}});
    w.config_int("cp_size", c.size());
    w.tensor("/activations/layer0/out", a, "[B,S,H]", "1");
    w.tensor("/gradients/w", b, "[C]", "1");
    w.timings("forward", {1.0 + c.rank(), 2.0, 3.0});
    c.all_reduce_scalar(1.0);
    w.comm(c);
    w.summary("out", 1e-7, 2e-7, 1e-5, true);
    EXPECT_FALSE(fs::exists(path));  // not visible before finish() (on any rank: the barrier keeps
    c.barrier();                     // rank 0 from finishing while another rank still looks)
    w.finish();
  }
  if (c.rank() == 0) {
    ResultsReader r(path);
    Tensor a2 = r.read("/activations/layer0/out");
    EXPECT_EQ(a2.shape(), a.shape());
    EXPECT_EQ(a2.to_vector(), a.to_vector());
    Tensor b2 = r.read("/gradients/w", DType::F32);
    EXPECT_EQ(b2.to_vector(), b.to_vector());
    EXPECT_EQ(r.string_attr("/config", "strategy"), "p2p");
    EXPECT_EQ(r.string_attr("/activations/layer0/out", "layout"), "[B,S,H]");
    EXPECT_EQ(r.double_attr("/config", "cp_size"), c.size());
    Tensor t = r.read("/timings/forward");
    EXPECT_EQ(t.shape(), (Shape{c.size(), 3}));
    for (int k = 0; k < c.size(); ++k) EXPECT_EQ(t.get(k * 3), 1.0 + k);
    EXPECT_TRUE(r.exists("/comm/all_reduce/bytes_sent"));
    EXPECT_EQ(r.double_attr("/summary/out", "pass"), 1.0);
    EXPECT_FALSE(r.exists("/nope/x"));
    std::remove(path.c_str());
  }
  c.barrier();
}

TEST(Results, AbandonedWriterLeavesNoFile) {
  MpiCommunicator c(MPI_COMM_WORLD);
  const std::string path = tmp_path(c, "hcp-abandoned");
  {
    ResultsWriter w(path, c);
    w.config({{"x", "y"}});
  }  // no finish(): e.g. an exception unwound the run
  c.barrier();
  EXPECT_FALSE(fs::exists(path));
  if (c.rank() == 0) {
    for (auto& e : fs::directory_iterator(fs::temp_directory_path()))
      EXPECT_EQ(e.path().string().find(path + ".tmp"), std::string::npos) << e.path();
  }
}

TEST(Results, UnwritableFolderIsAClearError) {
  MpiCommunicator c(MPI_COMM_WORLD);
  // The file is made at the first write (rank 0 writes): constructing a writer touches nothing.
  ResultsWriter w("/nonexistent-folder/x.h5", c);
  if (c.rank() == 0) {
    try {
      w.config({{"driver", "test"}});
      FAIL() << "writing into a missing folder did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot create results file '/nonexistent-folder/x.h5': No such file"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(ResultsReader("/nonexistent.h5"), Error);
}
