#include "comm/mpi_communicator.hpp"

#include <limits>

#include "core/clock.hpp"
#include "core/device_ops.hpp"

namespace hcp {
namespace {

// A buffer as MPI sees it: host memory as is; device memory (a device backend is registered and
// says so) through a page-locked host buffer of the communicator's cache: copied in for data MPI
// reads, out for data it writes. Open MPI here is not CUDA-aware, and NCCL refuses several ranks on
// one GPU.
class Stage {
 public:
  Stage(PinnedCache* cache, const void* p, std::size_t bytes, bool copy_in)
      : dev_(const_cast<void*>(p)), bytes_(bytes) {
    const DeviceOps* ops = device_ops();
    if (!ops || !p || bytes == 0 || !ops->is_device_ptr(p)) {
      host_ = dev_;
      return;
    }
    ops_ = ops;
    cache_ = cache;
    host_ = cache->take(bytes);
    if (copy_in) ops->copy(host_, Space::Host, p, Space::Cuda, bytes);
  }
  ~Stage() {
    if (cache_) cache_->give(host_);
  }
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;
  void* host() const { return host_; }
  void copy_out() const {
    if (ops_) ops_->copy(dev_, Space::Cuda, host_, Space::Host, bytes_);
  }

 private:
  const DeviceOps* ops_ = nullptr;
  PinnedCache* cache_ = nullptr;
  void* dev_ = nullptr;
  void* host_ = nullptr;
  std::size_t bytes_ = 0;
};

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::BF16:
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

// bf16 reductions: MPI has no bf16 type, so bf16 travels as 16-bit words and these user ops combine
// two operands by widening to fp32 and rounding the result back (one rounding per combine, as NCCL's
// bf16 reductions do). Open MPI applies them in a fixed order for a given size: repeatable.
template <bool kSum>
void bf16_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    b[i] = bf16(kSum ? x + y : (x > y ? x : y));
  }
}
MPI_Op mpi_op(DType dt, ReduceOp op) {
  if (dt != DType::BF16) return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
  static MPI_Op bf16_sum = MPI_OP_NULL, bf16_max = MPI_OP_NULL;  // created once, live until MPI_Finalize
  MPI_Op& o = op == ReduceOp::Sum ? bf16_sum : bf16_max;
  if (o == MPI_OP_NULL)
    HCP_MPI_CHECK(MPI_Op_create(op == ReduceOp::Sum ? &bf16_combine<true> : &bf16_combine<false>, 1, &o));
  return o;
}

int icount(std::int64_t n) {
  HCP_CHECK(n >= 0 && n <= std::numeric_limits<int>::max(), "MPI count ", n, " exceeds the int range");
  return static_cast<int>(n);
}

struct Timer {
  double t0 = now_seconds();
  double elapsed() const { return now_seconds() - t0; }
};

}  // namespace

PinnedCache* MpiCommunicator::cache() {
  if (!pinned_) {
    const DeviceOps* ops = device_ops();
    if (!ops) return nullptr;  // no device backend: no buffer is ever staged
    pinned_ = std::make_unique<PinnedCache>(ops->alloc_pinned, ops->free_pinned);
  }
  return pinned_.get();
}

std::string MpiCommunicator::backend() const { return device_ops() ? "mpi (device buffers host-staged)" : "mpi"; }

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  HCP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  HCP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  HCP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  HCP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::all_to_all(const void* send, void* recv, std::int64_t count, DType dt) {
  Timer t;
  Stage sb(cache(), send, dtype_bytes(count * size_, dt), true),
      rb(cache(), recv, dtype_bytes(count * size_, dt), false);
  HCP_MPI_CHECK(MPI_Alltoall(sb.host(), icount(count), mpi_type(dt), rb.host(), icount(count), mpi_type(dt), comm_));
  rb.copy_out();
  record("all_to_all", count * (size_ - 1) * static_cast<std::int64_t>(dtype_size(dt)), t.elapsed());
}

void MpiCommunicator::all_to_all_v(const void* send, const std::vector<std::int64_t>& send_counts, void* recv,
                                   const std::vector<std::int64_t>& recv_counts, DType dt) {
  HCP_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_,
            "all_to_all_v: need ", size_, " send and receive counts");
  Timer t;
  std::vector<int> sc(size_), rc(size_), sd(size_), rd(size_);
  std::int64_t so = 0, ro = 0, bytes = 0;
  for (int k = 0; k < size_; ++k) {
    sc[k] = icount(send_counts[k]);
    rc[k] = icount(recv_counts[k]);
    sd[k] = icount(so);
    rd[k] = icount(ro);
    so += send_counts[k];
    ro += recv_counts[k];
    if (k != rank_) bytes += send_counts[k];
  }
  Stage sb(cache(), send, dtype_bytes(so, dt), true), rb(cache(), recv, dtype_bytes(ro, dt), false);
  HCP_MPI_CHECK(MPI_Alltoallv(sb.host(), sc.data(), sd.data(), mpi_type(dt), rb.host(), rc.data(), rd.data(),
                              mpi_type(dt), comm_));
  rb.copy_out();
  record("all_to_all_v", bytes * static_cast<std::int64_t>(dtype_size(dt)), t.elapsed());
}

void MpiCommunicator::all_gather(const void* send, void* recv, std::int64_t count, DType dt) {
  Timer t;
  Stage sb(cache(), send, dtype_bytes(count, dt), true), rb(cache(), recv, dtype_bytes(count * size_, dt), false);
  HCP_MPI_CHECK(MPI_Allgather(sb.host(), icount(count), mpi_type(dt), rb.host(), icount(count), mpi_type(dt), comm_));
  rb.copy_out();
  record("all_gather", count * (size_ - 1) * static_cast<std::int64_t>(dtype_size(dt)), t.elapsed());
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, ReduceOp op) {
  Timer t;
  Stage sb(cache(), send, dtype_bytes(count * size_, dt), true), rb(cache(), recv, dtype_bytes(count, dt), false);
  HCP_MPI_CHECK(MPI_Reduce_scatter_block(sb.host(), rb.host(), icount(count), mpi_type(dt), mpi_op(dt, op), comm_));
  rb.copy_out();
  record("reduce_scatter", count * (size_ - 1) * static_cast<std::int64_t>(dtype_size(dt)), t.elapsed());
}

void MpiCommunicator::all_reduce(void* buf, std::int64_t count, DType dt, ReduceOp op) {
  Timer t;
  Stage b(cache(), buf, dtype_bytes(count, dt), true);
  HCP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, b.host(), icount(count), mpi_type(dt), mpi_op(dt, op), comm_));
  b.copy_out();
  // Ring all-reduce cost: 2 (p-1)/p of the buffer per rank.
  record("all_reduce", size_ > 1 ? 2 * count * (size_ - 1) / size_ * static_cast<std::int64_t>(dtype_size(dt)) : 0,
         t.elapsed());
}

void MpiCommunicator::broadcast(void* buf, std::int64_t count, DType dt, int root) {
  Timer t;
  Stage b(cache(), buf, dtype_bytes(count, dt), rank_ == root);
  HCP_MPI_CHECK(MPI_Bcast(b.host(), icount(count), mpi_type(dt), root, comm_));
  if (rank_ != root) b.copy_out();
  record("broadcast", rank_ == root ? count * static_cast<std::int64_t>(dtype_size(dt)) : 0, t.elapsed());
}

void MpiCommunicator::send(const void* buf, std::int64_t count, DType dt, int dst, int tag) {
  Timer t;
  Stage b(cache(), buf, dtype_bytes(count, dt), true);
  HCP_MPI_CHECK(MPI_Send(b.host(), icount(count), mpi_type(dt), dst, tag, comm_));
  record("send", count * static_cast<std::int64_t>(dtype_size(dt)), t.elapsed());
}

void MpiCommunicator::recv(void* buf, std::int64_t count, DType dt, int src, int tag) {
  Timer t;
  Stage b(cache(), buf, dtype_bytes(count, dt), false);
  HCP_MPI_CHECK(MPI_Recv(b.host(), icount(count), mpi_type(dt), src, tag, comm_, MPI_STATUS_IGNORE));
  b.copy_out();
  record("recv", 0, t.elapsed());
}

RingRequest MpiCommunicator::ring_post(const void* send, void* recv, std::int64_t count, DType dt, int dst, int src,
                                       int tag) {
  RingRequest r;
  r.posted_at = now_seconds();
  MPI_Request rq[2];
  auto rs = std::make_shared<Stage>(cache(), recv, dtype_bytes(count, dt), false);
  auto ss = std::make_shared<Stage>(cache(), send, dtype_bytes(count, dt), true);
  HCP_MPI_CHECK(MPI_Irecv(rs->host(), icount(count), mpi_type(dt), src, tag, comm_, &rq[0]));
  HCP_MPI_CHECK(MPI_Isend(ss->host(), icount(count), mpi_type(dt), dst, tag, comm_, &rq[1]));
  // Staging buffers live until ring_wait (the receive one is copied out there).
  r.handles.push_back(static_cast<std::int64_t>(pending_.size()));
  pending_.push_back(rq[0]);
  staged_.push_back(std::static_pointer_cast<void>(rs));
  r.handles.push_back(static_cast<std::int64_t>(pending_.size()));
  pending_.push_back(rq[1]);
  staged_.push_back(std::static_pointer_cast<void>(ss));
  r.active = true;
  record("ring_post", count * static_cast<std::int64_t>(dtype_size(dt)), now_seconds() - r.posted_at);
  return r;
}

void MpiCommunicator::ring_wait(RingRequest& req) {
  HCP_CHECK(req.active, "ring_wait on a request that is not in flight");
  Timer t;
  for (auto h : req.handles) HCP_MPI_CHECK(MPI_Wait(&pending_[static_cast<std::size_t>(h)], MPI_STATUS_IGNORE));
  static_cast<Stage*>(staged_[static_cast<std::size_t>(req.handles[0])].get())->copy_out();  // the receive
  for (auto h : req.handles) staged_[static_cast<std::size_t>(h)].reset();
  req.active = false;
  // Forget completed requests once nothing is in flight.
  bool any = false;
  for (auto& q : pending_) any = any || q != MPI_REQUEST_NULL;
  if (!any) {
    pending_.clear();
    staged_.clear();
  }
  record("ring_wait", 0, t.elapsed());
}

void MpiCommunicator::barrier() {
  Timer t;
  HCP_MPI_CHECK(MPI_Barrier(comm_));
  record("barrier", 0, t.elapsed());
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) const {
  MPI_Comm sub;
  HCP_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  auto c = std::make_unique<MpiCommunicator>(sub);
  MPI_Comm_free(&sub);
  return c;
}

}  // namespace hcp
