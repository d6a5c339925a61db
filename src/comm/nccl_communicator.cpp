#include "comm/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <map>

#include "comm/device_order.hpp"
#include "core/clock.hpp"
#include "core/cuda_check.hpp"

namespace hcp {
namespace {
ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
  }
  return ncclFloat32;
}
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }
// A host buffer seen through device memory (NCCL needs device pointers); device buffers as is.
class DevStage {
 public:
  DevStage(const void* p, std::size_t bytes, bool copy_in) : user_(const_cast<void*>(p)), bytes_(bytes) {
    if (!p || bytes == 0 || is_device_pointer(p)) {
      dev_ = user_;
      return;
    }
    HCP_CUDA_CHECK(cudaMalloc(&dev_, bytes));
    owned_ = true;
    if (copy_in) HCP_CUDA_CHECK(cudaMemcpy(dev_, p, bytes, cudaMemcpyHostToDevice));
  }
  ~DevStage() {
    if (owned_) cudaFree(dev_);
  }
  DevStage(const DevStage&) = delete;
  DevStage& operator=(const DevStage&) = delete;
  void* dev() const { return dev_; }
  bool staged() const { return owned_; }  // a host buffer: the host must wait for the result
  void copy_out() const {
    if (owned_) HCP_CUDA_CHECK(cudaMemcpy(user_, dev_, bytes_, cudaMemcpyDeviceToHost));
  }

 private:
  void* user_ = nullptr;
  void* dev_ = nullptr;
  std::size_t bytes_ = 0;
  bool owned_ = false;
};
}  // namespace

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  std::atomic<bool> aborted{false};
  std::unique_ptr<DeviceOrder> order;
  std::map<std::int64_t, std::shared_ptr<DeviceOrder::Mark>> ring;  // in-flight ring steps
  std::int64_t next_ring = 0;

  // The stream, the end events and the watchdog: an asynchronous NCCL error or a timeout aborts
  // the communicator (from the watchdog thread, as NCCL allows), and the next call throws.
  void start(double timeout_s) {
    order = std::make_unique<DeviceOrder>(
        timeout_s,
        [this]() -> std::string {
          ncclResult_t async = ncclSuccess;
          if (aborted || ncclCommGetAsyncError(comm, &async) != ncclSuccess || async == ncclSuccess) return {};
          return ncclGetErrorString(async);
        },
        [this](const std::string&) { abort(); });
  }
  cudaStream_t stream() const { return order->stream(); }
  void abort() {
    bool was = false;
    if (aborted.compare_exchange_strong(was, true) && comm) ncclCommAbort(comm);
  }
  ~Impl() {
    ring.clear();
    order.reset();  // waits for the stream unless the watchdog fired
    if (comm && !aborted) ncclCommDestroy(comm);
  }
};

NcclCommunicator::NcclCommunicator(Communicator& boot, double timeout_s)
    : impl_(std::make_unique<Impl>()), rank_(boot.rank()), size_(boot.size()), timeout_s_(timeout_s) {
  int dev = -1;
  HCP_CUDA_CHECK(cudaGetDevice(&dev));
  // Two ranks on one GPU: NCCL would refuse ("invalid usage"); say why instead.
  char bus[64] = {0};
  HCP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
  std::vector<char> all(static_cast<std::size_t>(64 * size_));
  boot.all_gather(bus, all.data(), 64 / static_cast<std::int64_t>(dtype_size(DType::F32)), DType::F32);
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && std::strncmp(all.data() + 64 * r, bus, 64) == 0)
      HCP_FAIL("NCCL needs one GPU per rank: ranks ", rank_, " and ", r, " share GPU ", bus,
               " (use the host-staged MPI backend)");
  ncclUniqueId id;
  if (rank_ == 0) HCP_NCCL_CHECK(ncclGetUniqueId(&id));
  static_assert(sizeof(ncclUniqueId) % 4 == 0, "unique id size");
  boot.broadcast(&id, static_cast<std::int64_t>(sizeof id / 4), DType::F32, 0);
  HCP_NCCL_CHECK(ncclCommInitRank(&impl_->comm, size_, id, rank_));
  impl_->start(timeout_s_);
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int size, double timeout_s)
    : impl_(std::move(impl)), rank_(rank), size_(size), timeout_s_(timeout_s) {}

NcclCommunicator::~NcclCommunicator() = default;

// Enqueues an operation on the communication stream after the compute queued so far and makes the
// default stream wait for it; the host waits only when a staged host buffer needs the result.
#define HCP_NCCL_TIMED(opname, bytes, host_result, ...) \
  do {                                                  \
    const double t0_ = now_seconds();                   \
    impl_->order->begin();                              \
    __VA_ARGS__;                                        \
    if (host_result)                                    \
      impl_->order->wait_host(opname);                  \
    else                                                \
      impl_->order->end(opname);                        \
    record(opname, bytes, now_seconds() - t0_);         \
  } while (0)

void NcclCommunicator::all_to_all(const void* send, void* recv, std::int64_t count, DType dt) {
  DevStage s(send, dtype_bytes(count * size_, dt), true), r(recv, dtype_bytes(count * size_, dt), false);
  const std::size_t blk = dtype_bytes(count, dt);
  HCP_NCCL_TIMED("all_to_all", count * (size_ - 1) * static_cast<std::int64_t>(dtype_size(dt)), r.staged(), {
    HCP_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      HCP_NCCL_CHECK(
          ncclSend(static_cast<const char*>(s.dev()) + p * blk, count, nccl_type(dt), p, impl_->comm, impl_->stream()));
      HCP_NCCL_CHECK(
          ncclRecv(static_cast<char*>(r.dev()) + p * blk, count, nccl_type(dt), p, impl_->comm, impl_->stream()));
    }
    HCP_NCCL_CHECK(ncclGroupEnd());
  });
  r.copy_out();
}

void NcclCommunicator::all_to_all_v(const void* send, const std::vector<std::int64_t>& sc, void* recv,
                                    const std::vector<std::int64_t>& rc, DType dt) {
  HCP_CHECK(static_cast<int>(sc.size()) == size_ && static_cast<int>(rc.size()) == size_, "all_to_all_v: need ", size_,
            " send and receive counts");
  std::int64_t ns = 0, nr = 0, bytes = 0;
  for (int p = 0; p < size_; ++p) {
    ns += sc[static_cast<std::size_t>(p)];
    nr += rc[static_cast<std::size_t>(p)];
    if (p != rank_) bytes += sc[static_cast<std::size_t>(p)];
  }
  DevStage s(send, dtype_bytes(ns, dt), true), r(recv, dtype_bytes(nr, dt), false);
  HCP_NCCL_TIMED("all_to_all_v", bytes * static_cast<std::int64_t>(dtype_size(dt)), r.staged(), {
    HCP_NCCL_CHECK(ncclGroupStart());
    std::size_t so = 0, ro = 0;
    for (int p = 0; p < size_; ++p) {
      const auto n_s = sc[static_cast<std::size_t>(p)], n_r = rc[static_cast<std::size_t>(p)];
      if (n_s)
        HCP_NCCL_CHECK(
            ncclSend(static_cast<const char*>(s.dev()) + so, n_s, nccl_type(dt), p, impl_->comm, impl_->stream()));
      if (n_r)
        HCP_NCCL_CHECK(ncclRecv(static_cast<char*>(r.dev()) + ro, n_r, nccl_type(dt), p, impl_->comm, impl_->stream()));
      so += dtype_bytes(n_s, dt);
      ro += dtype_bytes(n_r, dt);
    }
    HCP_NCCL_CHECK(ncclGroupEnd());
  });
  r.copy_out();
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::int64_t count, DType dt) {
  DevStage s(send, dtype_bytes(count, dt), true), r(recv, dtype_bytes(count * size_, dt), false);
  HCP_NCCL_TIMED("all_gather", count * (size_ - 1) * static_cast<std::int64_t>(dtype_size(dt)), r.staged(),
                 HCP_NCCL_CHECK(ncclAllGather(s.dev(), r.dev(), count, nccl_type(dt), impl_->comm, impl_->stream())));
  r.copy_out();
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, ReduceOp op) {
  DevStage s(send, dtype_bytes(count * size_, dt), true), r(recv, dtype_bytes(count, dt), false);
  HCP_NCCL_TIMED("reduce_scatter", count * (size_ - 1) * static_cast<std::int64_t>(dtype_size(dt)), r.staged(),
                 HCP_NCCL_CHECK(ncclReduceScatter(s.dev(), r.dev(), count, nccl_type(dt), nccl_op(op), impl_->comm,
                                                  impl_->stream())));
  r.copy_out();
}

void NcclCommunicator::all_reduce(void* buf, std::int64_t count, DType dt, ReduceOp op) {
  DevStage b(buf, dtype_bytes(count, dt), true);
  HCP_NCCL_TIMED(
      "all_reduce", size_ > 1 ? 2 * count * (size_ - 1) / size_ * static_cast<std::int64_t>(dtype_size(dt)) : 0,
      b.staged(),
      HCP_NCCL_CHECK(ncclAllReduce(b.dev(), b.dev(), count, nccl_type(dt), nccl_op(op), impl_->comm, impl_->stream())));
  b.copy_out();
}

void NcclCommunicator::broadcast(void* buf, std::int64_t count, DType dt, int root) {
  DevStage b(buf, dtype_bytes(count, dt), rank_ == root);
  HCP_NCCL_TIMED(
      "broadcast", rank_ == root ? count * static_cast<std::int64_t>(dtype_size(dt)) : 0, b.staged(),
      HCP_NCCL_CHECK(ncclBroadcast(b.dev(), b.dev(), count, nccl_type(dt), root, impl_->comm, impl_->stream())));
  if (rank_ != root) b.copy_out();
}

void NcclCommunicator::send(const void* buf, std::int64_t count, DType dt, int dst, int /*tag*/) {
  DevStage b(buf, dtype_bytes(count, dt), true);
  HCP_NCCL_TIMED("send", count * static_cast<std::int64_t>(dtype_size(dt)), b.staged(),
                 HCP_NCCL_CHECK(ncclSend(b.dev(), count, nccl_type(dt), dst, impl_->comm, impl_->stream())));
}

void NcclCommunicator::recv(void* buf, std::int64_t count, DType dt, int src, int /*tag*/) {
  DevStage b(buf, dtype_bytes(count, dt), false);
  HCP_NCCL_TIMED("recv", 0, b.staged(),
                 HCP_NCCL_CHECK(ncclRecv(b.dev(), count, nccl_type(dt), src, impl_->comm, impl_->stream())));
  b.copy_out();
}

RingRequest NcclCommunicator::ring_post(const void* send, void* recv, std::int64_t count, DType dt, int dst, int src,
                                        int /*tag*/) {
  HCP_CHECK(is_device_pointer(send) && is_device_pointer(recv), "NCCL ring_post needs device buffers");
  RingRequest r;
  r.posted_at = now_seconds();
  impl_->order->begin();
  HCP_NCCL_CHECK(ncclGroupStart());
  HCP_NCCL_CHECK(ncclSend(send, count, nccl_type(dt), dst, impl_->comm, impl_->stream()));
  HCP_NCCL_CHECK(ncclRecv(recv, count, nccl_type(dt), src, impl_->comm, impl_->stream()));
  HCP_NCCL_CHECK(ncclGroupEnd());
  const std::int64_t h = impl_->next_ring++;
  impl_->ring[h] = impl_->order->mark("ring step");
  r.handles.push_back(h);
  r.active = true;
  record("ring_post", count * static_cast<std::int64_t>(dtype_size(dt)), now_seconds() - r.posted_at);
  return r;
}

void NcclCommunicator::ring_wait(RingRequest& req) {
  HCP_CHECK(req.active, "ring_wait on a request that is not in flight");
  const double t0 = now_seconds();
  const auto it = impl_->ring.find(req.handles.at(0));
  HCP_CHECK(it != impl_->ring.end(), "ring_wait: unknown request");
  impl_->order->check();
  DeviceOrder::default_waits(*it->second);  // later compute sees the received block
  impl_->ring.erase(it);
  req.active = false;
  record("ring_wait", 0, now_seconds() - t0);
}

void NcclCommunicator::barrier() {
  float one = 1;
  DevStage b(&one, sizeof one, true);
  HCP_NCCL_TIMED(
      "barrier", 0, true,
      HCP_NCCL_CHECK(ncclAllReduce(b.dev(), b.dev(), 1, ncclFloat32, ncclSum, impl_->comm, impl_->stream())));
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) const {
  auto impl = std::make_unique<Impl>();
  HCP_NCCL_CHECK(ncclCommSplit(impl_->comm, color, key, &impl->comm, nullptr));
  int r = 0, n = 0;
  HCP_NCCL_CHECK(ncclCommUserRank(impl->comm, &r));
  HCP_NCCL_CHECK(ncclCommCount(impl->comm, &n));
  impl->start(timeout_s_);
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(impl), r, n, timeout_s_));
}

}  // namespace hcp
