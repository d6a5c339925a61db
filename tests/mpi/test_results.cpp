// HDF5 results: write from every rank count, read back bit for bit; abandoned files are removed.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
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
    w.comm(c.counters(), 1, true);
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

namespace {
// Rows of a [T, 3, 2] tensor dealt to the ranks in a scattered order (rank r holds global rows
// r, r + p, ...; local order reversed, plus one unwritten row), as a DualChunkSwap layout deals tokens.
struct Dealt {
  Tensor local;
  std::vector<std::int64_t> rows;
};
Dealt deal(const Tensor& global, int rank, int p) {
  std::vector<std::int64_t> mine;
  for (std::int64_t i = rank; i < global.size(0); i += p) mine.push_back(i);
  std::reverse(mine.begin(), mine.end());
  mine.push_back(-1);  // a pad: not written
  Tensor local = Tensor::zeros({static_cast<std::int64_t>(mine.size()), 3, 2}, global.dtype());
  for (std::size_t k = 0; k + 1 < mine.size(); ++k)
    local.slice(0, static_cast<std::int64_t>(k), 1).copy_from(global.slice(0, mine[k], 1));
  local.slice(0, static_cast<std::int64_t>(mine.size()) - 1, 1).fill(1e300);  // must not reach the file
  return {local, mine};
}

void write_run(const std::string& path, MpiCommunicator& c, H5Io io, const std::string& save, const Tensor& g) {
  ResultsWriter w(path, c, io, SaveSet(save));
  w.config({{"strategy", "p2p"}});
  const Dealt d = deal(g, c.rank(), c.size());
  w.rows("/activations/p2p/o", d.local, d.rows, g.size(0), "[T,H,D]", "1");
  w.rows("/gradients/p2p/dq", d.local.to(DType::BF16), d.rows, g.size(0), "[T,H,D]", "1");
  Tensor ref = c.rank() == 0 ? g : Tensor();
  w.tensor("/activations/reference/o", ref, "[T,H,D]", "1");
  w.summary("p2p/o", 1e-7, 2e-7, 1e-5, true);
  w.timings("p2p/forward", {1.0 + c.rank(), 2.0});
  w.finish();
}
}  // namespace

// Collective (parallel HDF5, each rank its own hyperslabs) and gather (rank 0 writes) give the same
// datasets, bit for bit, with the same chunking; pads are not written.
TEST(Results, CollectiveAndGatherWriteTheSameTensors) {
  if (!hdf5_parallel()) GTEST_SKIP() << "serial HDF5: only the gather mode exists";
  MpiCommunicator c(MPI_COMM_WORLD);
  const std::string pc = tmp_path(c, "hcp-collective"), pg = tmp_path(c, "hcp-gather");
  Tensor g = Tensor::empty({37, 3, 2}, DType::F64, Space::Host);
  fill_uniform(g, 5);
  write_run(pc, c, H5Io::Collective, "all", g);
  write_run(pg, c, H5Io::Gather, "all", g);
  if (c.rank() == 0) {
    ResultsReader a(pc), b(pg);
    for (const char* n :
         {"/activations/p2p/o", "/gradients/p2p/dq", "/activations/reference/o", "/timings/p2p/forward"}) {
      const Tensor x = a.read(n), y = b.read(n);
      EXPECT_EQ(x.shape(), y.shape()) << n;
      EXPECT_EQ(x.to_vector(), y.to_vector()) << n;
      EXPECT_EQ(checksum(x), checksum(y)) << n;
      for (const char* s : {"l2", "max_abs", "mean", "count"}) {
        if (std::string(n).rfind("/timings", 0) != 0) {
          EXPECT_EQ(a.double_attr(std::string("/stats") + n, s), b.double_attr(std::string("/stats") + n, s))
              << n << " " << s;
        }
      }
    }
    EXPECT_EQ(a.read("/activations/p2p/o").to_vector(), g.to_vector());  // pads (1e300) not written
    EXPECT_EQ(a.read("/activations/reference/o").to_vector(), g.to_vector());
    EXPECT_EQ(a.double_attr("/stats/activations/p2p/o", "count"), static_cast<double>(g.numel()));
    EXPECT_EQ(a.double_attr("/summary/p2p/o", "pass"), 1.0);
    EXPECT_EQ(a.string_attr("/config", "hdf5_io").rfind("collective", 0), 0u);
    EXPECT_EQ(b.string_attr("/config", "hdf5_io").rfind("gather", 0), 0u);
    std::remove(pc.c_str());
    std::remove(pg.c_str());
  }
  c.barrier();
}

// run.save: a run that keeps only the summary has no tensors but their statistics; names select.
TEST(Results, SaveKeepsWhatItNames) {
  MpiCommunicator c(MPI_COMM_WORLD);
  const H5Io io = hdf5_parallel() ? H5Io::Collective : H5Io::Gather;
  const std::string p1 = tmp_path(c, "hcp-save-summary"), p2 = tmp_path(c, "hcp-save-named");
  Tensor g = Tensor::empty({20, 3, 2}, DType::F64, Space::Host);
  fill_uniform(g, 6);
  write_run(p1, c, io, "summary,timings", g);
  write_run(p2, c, io, "dq, activations/reference", g);
  if (c.rank() == 0) {
    ResultsReader a(p1), b(p2);
    EXPECT_FALSE(a.exists("/activations/p2p/o"));
    EXPECT_FALSE(a.exists("/gradients/p2p/dq"));
    EXPECT_TRUE(a.exists("/timings/p2p/forward"));
    EXPECT_TRUE(a.exists("/summary/p2p/o"));
    double sq = 0;
    for (double v : g.to_vector()) sq += v * v;
    EXPECT_NEAR(a.double_attr("/stats/activations/p2p/o", "l2"), std::sqrt(sq), 1e-12 * std::sqrt(sq));
    EXPECT_EQ(a.string_attr("/config", "save"), "summary,timings");
    EXPECT_TRUE(b.exists("/gradients/p2p/dq"));
    EXPECT_TRUE(b.exists("/activations/reference/o"));
    EXPECT_FALSE(b.exists("/activations/p2p/o"));
    EXPECT_FALSE(b.exists("/timings/p2p/forward"));
    EXPECT_FALSE(b.exists("/summary/p2p/o"));
    std::remove(p1.c_str());
    std::remove(p2.c_str());
  }
  c.barrier();
  EXPECT_THROW(SaveSet("summary,,timings"), Error);
  EXPECT_THROW(SaveSet("activations/p2p o"), Error);
  EXPECT_TRUE(SaveSet("auto").keeps("/activations/x", SaveSet::kAutoMaxElements));
  EXPECT_FALSE(SaveSet("auto").keeps("/activations/x", SaveSet::kAutoMaxElements + 1));
  EXPECT_TRUE(SaveSet("auto").keeps("/params/w", SaveSet::kAutoMaxElements + 1));
}

// A tensor written in row parts by every rank: its checksum is the sum of the parts' checksum_part,
// and read_rows reads back exactly the rows asked for; a change of one value changes the checksum.
TEST(Results, PartsChecksumAndRowReads) {
  MpiCommunicator c(MPI_COMM_WORLD);
  const std::string path = tmp_path(c, "hcp-parts");
  const int n = c.size(), r = c.rank();
  const std::int64_t rows = 3, width = 4, total = rows * n;
  Tensor whole = Tensor::empty({total, 2, width / 2}, DType::F64);
  fill_uniform(whole, 11);
  const Tensor mine = whole.slice(0, r * rows, rows).clone();
  std::vector<std::int64_t> file_rows;
  for (std::int64_t i = 0; i < rows; ++i) file_rows.push_back(r * rows + i);
  {
    ResultsWriter w(path, c);
    w.rows("/parts", mine, file_rows, total, "[R,2,2]", "1");
    w.finish();
  }
  std::uint64_t sum = checksum_part(mine, r * rows * width);
  std::vector<double> all(static_cast<std::size_t>(n));
  // Sum modulo 2^64 from every rank's part (in 16-bit limbs, exact in fp64).
  std::uint64_t total_sum = 0;
  for (int k = 0; k < 4; ++k) {
    double limb = static_cast<double>((sum >> (16 * k)) & 0xffffu);
    limb = c.all_reduce_scalar(limb);
    total_sum += static_cast<std::uint64_t>(limb) << (16 * k);
  }
  EXPECT_EQ(checksum_hex(total_sum), checksum(whole));
  Tensor changed = whole.clone();
  changed.set(5, changed.get(5) + 1e-12);
  EXPECT_NE(checksum(changed), checksum(whole));
  Tensor swapped = whole.clone();  // the same values in another order
  swapped.set(0, whole.get(1));
  swapped.set(1, whole.get(0));
  EXPECT_NE(checksum(swapped), checksum(whole));
  if (r == 0) {
    ResultsReader rd(path);
    EXPECT_EQ(checksum(rd.read("/parts")), checksum(whole));
    const std::int64_t first = 1;  // rows 1 and 2: inside rank 0's part at any rank count
    const Tensor back = rd.read_rows("/parts", first, 2);
    ASSERT_EQ(back.shape(), (Shape{2, 2, width / 2}));
    for (std::int64_t i = 0; i < back.numel(); ++i) EXPECT_EQ(back.get(i), whole.get(first * width + i));
    EXPECT_THROW(rd.read_rows("/parts", total - 1, 2), Error);
  }
  c.barrier();
  if (r == 0) fs::remove(path);
}
