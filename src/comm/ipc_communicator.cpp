#include "comm/ipc_communicator.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include "comm/device_order.hpp"
#include "comm/ipc_reduce.hpp"
#include "comm/mpi_communicator.hpp"
#include "core/clock.hpp"
#include "core/cuda_check.hpp"

namespace hcp {
namespace {

// What a rank tells its peers about one channel: its exported buffer (gen counts its growths)
// and its two interprocess events.
struct Published {
  cudaIpcMemHandle_t mem{};
  cudaIpcEventHandle_t ready{}, done{};
  std::int64_t gen = 0;
};

// One exported buffer of this rank and its peers' views of theirs. `ready`: this rank's data is
// in its buffer; `done`: this rank has finished reading its peers' buffers.
struct Channel {
  bool live = false;
  void* buf = nullptr;
  std::size_t cap = 0;
  std::vector<void*> retired;  // outgrown buffers, freed once no peer maps them
  cudaEvent_t ready = nullptr, done = nullptr;
  Published pub;
  struct Peer {
    void* buf = nullptr;
    std::int64_t gen = 0;
    cudaEvent_t ready = nullptr, done = nullptr;
  };
  std::vector<Peer> peers;
};

struct Ring {
  int tag, dst, src;
  void* recv;
  std::size_t bytes;
};

}  // namespace

struct IpcCommunicator::Impl {
  MPI_Comm sync = MPI_COMM_NULL;  // the host messages (a private duplicate)
  int rank = 0, size = 1;
  std::unique_ptr<MpiCommunicator> host;  // host buffers
  std::unique_ptr<DeviceOrder> order;
  Channel main;                  // the collectives'
  std::map<int, Channel> rings;  // one per ring tag
  std::map<std::int64_t, Ring> inflight;
  std::int64_t next_handle = 0;

  cudaStream_t stream() const { return order->stream(); }
  void copy(void* dst, const void* src, std::size_t n) const {
    if (n) HCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream()));
  }
  void wait(cudaEvent_t e) const { HCP_CUDA_CHECK(cudaStreamWaitEvent(stream(), e, 0)); }

  void open(Channel& ch) {
    if (ch.live) return;
    const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
    HCP_CUDA_CHECK(cudaEventCreateWithFlags(&ch.ready, flags));
    HCP_CUDA_CHECK(cudaEventCreateWithFlags(&ch.done, flags));
    HCP_CUDA_CHECK(cudaIpcGetEventHandle(&ch.pub.ready, ch.ready));
    HCP_CUDA_CHECK(cudaIpcGetEventHandle(&ch.pub.done, ch.done));
    ch.peers.assign(static_cast<std::size_t>(size), {});
    ch.live = true;
  }
  // Grows this rank's buffer to hold `bytes` (a new export; the old one is retired).
  static void reserve(Channel& ch, std::size_t bytes) {
    if (bytes <= ch.cap) return;
    if (ch.buf) ch.retired.push_back(ch.buf);
    std::size_t cap = std::max<std::size_t>({bytes, 2 * ch.cap, std::size_t(1) << 20});
    cap = (cap + 0xFFFF) & ~std::size_t(0xFFFF);
    HCP_CUDA_CHECK(cudaMalloc(&ch.buf, cap));
    HCP_CUDA_CHECK(cudaIpcGetMemHandle(&ch.pub.mem, ch.buf));
    ch.cap = cap;
    ch.pub.gen += 1;
  }
  // Maps peer p's events (once) and, when it has a new one, its buffer.
  void adopt(Channel& ch, int p, const Published& pp, bool map_buffer) {
    Channel::Peer& q = ch.peers[static_cast<std::size_t>(p)];
    if (p == rank) {
      q.buf = ch.buf;
      q.ready = ch.ready;
      q.done = ch.done;
      return;
    }
    if (!q.ready) {
      HCP_CUDA_CHECK(cudaIpcOpenEventHandle(&q.ready, pp.ready));
      HCP_CUDA_CHECK(cudaIpcOpenEventHandle(&q.done, pp.done));
    }
    if (!map_buffer || pp.gen == q.gen) return;
    if (q.buf) {  // copies queued earlier may still read the old mapping
      HCP_CUDA_CHECK(cudaStreamSynchronize(stream()));
      HCP_CUDA_CHECK(cudaIpcCloseMemHandle(q.buf));
      q.buf = nullptr;
    }
    HCP_CUDA_CHECK(cudaIpcOpenMemHandle(&q.buf, pp.mem, cudaIpcMemLazyEnablePeerAccess));
    q.gen = pp.gen;
  }
  // Retired buffers of the collectives' channel: after the "ready" exchange every peer has
  // unmapped them (it does so when it adopts the new export, before that exchange); the stream
  // has waited for the peers' reads of them.
  void free_retired(Channel& ch) {
    if (ch.retired.empty()) return;
    HCP_CUDA_CHECK(cudaStreamSynchronize(stream()));
    for (void* b : ch.retired) HCP_CUDA_CHECK(cudaFree(b));
    ch.retired.clear();
  }

  // A collective in three steps. begin: export `bytes` (growing first), map every peer's export,
  // then the stream waits for the compute queued so far and for every peer to have finished
  // reading this rank's buffer in the previous collective (their `done`, recorded before this
  // exchange). The caller then copies its data into main.buf.
  void begin(std::size_t bytes) {
    open(main);
    reserve(main, bytes);
    std::vector<Published> all(static_cast<std::size_t>(size));
    HCP_MPI_CHECK(MPI_Allgather(&main.pub, sizeof(Published), MPI_BYTE, all.data(), sizeof(Published), MPI_BYTE, sync));
    for (int p = 0; p < size; ++p) adopt(main, p, all[static_cast<std::size_t>(p)], true);
    order->begin();
    for (int p = 0; p < size; ++p)
      if (p != rank) wait(main.peers[static_cast<std::size_t>(p)].done);
  }
  // ready: this rank's data is in place; `exchange` (a barrier unless given) tells the peers so,
  // after which the stream waits for theirs.
  void ready(const std::function<void()>& exchange = {}) {
    HCP_CUDA_CHECK(cudaEventRecord(main.ready, stream()));
    if (exchange)
      exchange();
    else
      HCP_MPI_CHECK(MPI_Barrier(sync));
    for (int p = 0; p < size; ++p)
      if (p != rank) wait(main.peers[static_cast<std::size_t>(p)].ready);
    free_retired(main);
  }
  // end: this rank has read what it needs; the default stream waits for the received data.
  void end(const std::string& op) {
    HCP_CUDA_CHECK(cudaEventRecord(main.done, stream()));
    order->end(op);
  }
  const void* peer_buf(int p) const { return main.peers[static_cast<std::size_t>(p)].buf; }

  void release(Channel& ch, bool free_own) {
    if (!ch.live) return;
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      auto& q = ch.peers[static_cast<std::size_t>(p)];
      if (q.buf) cudaIpcCloseMemHandle(q.buf);
      if (q.ready) cudaEventDestroy(q.ready);
      if (q.done) cudaEventDestroy(q.done);
    }
    if (free_own) {
      if (ch.buf) cudaFree(ch.buf);
      for (void* b : ch.retired) cudaFree(b);
    }
    cudaEventDestroy(ch.ready);
    cudaEventDestroy(ch.done);
    ch.live = false;
  }

  ~Impl() {
    if (!order) {  // the constructor failed before the channels existed
      if (sync != MPI_COMM_NULL) MPI_Comm_free(&sync);
      return;
    }
    bool quiet = true;
    try {
      order->synchronize();
    } catch (...) {
      quiet = false;
    }
    inflight.clear();
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Peers may still be reading this rank's buffers: they are freed once every rank got here
    // (a bounded wait; past it, they are left to the process's end).
    if (quiet && !finalized) {
      MPI_Request rq;
      int flag = 0;
      if (MPI_Ibarrier(sync, &rq) == MPI_SUCCESS) {
        for (const double t0 = now_seconds(); !flag && now_seconds() - t0 < 10.0;) {
          MPI_Test(&rq, &flag, MPI_STATUS_IGNORE);
          if (!flag) std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      }
      quiet = flag != 0;
    }
    release(main, quiet);
    for (auto& [tag, ch] : rings) release(ch, quiet);
    order.reset();
    if (quiet && !finalized && sync != MPI_COMM_NULL) MPI_Comm_free(&sync);
  }
};

bool IpcCommunicator::possible(MPI_Comm comm) {
  MPI_Comm node;
  HCP_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int n = 0, all = 0;
  MPI_Comm_size(node, &n);
  MPI_Comm_size(comm, &all);
  MPI_Comm_free(&node);
  int ok = n == all && all <= ipc::kMaxRanks ? 1 : 0, every = 0;
  HCP_MPI_CHECK(MPI_Allreduce(&ok, &every, 1, MPI_INT, MPI_MIN, comm));
  return every == 1;
}

IpcCommunicator::IpcCommunicator(MPI_Comm comm, double timeout_s) : impl_(std::make_unique<Impl>()) {
  HCP_CHECK(possible(comm), "CUDA IPC needs every rank of the group on one node, at most ", ipc::kMaxRanks);
  HCP_MPI_CHECK(MPI_Comm_dup(comm, &impl_->sync));
  HCP_MPI_CHECK(MPI_Comm_rank(impl_->sync, &rank_));
  HCP_MPI_CHECK(MPI_Comm_size(impl_->sync, &size_));
  impl_->rank = rank_;
  impl_->size = size_;
  impl_->host = std::make_unique<MpiCommunicator>(comm);
  // A hung copy cannot be cancelled on the device: the watchdog ends the job, naming the op.
  impl_->order = std::make_unique<DeviceOrder>(timeout_s, DeviceOrder::Probe{}, [](const std::string& why) {
    std::fprintf(stderr, "error: CUDA IPC %s; aborting the job\n", why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  });
}

IpcCommunicator::~IpcCommunicator() = default;

std::size_t IpcCommunicator::exported_bytes() const {
  std::size_t n = impl_->main.cap;
  for (const auto& [tag, ch] : impl_->rings) n += ch.cap;
  return n;
}

// Host buffers (or a mix) go through MPI; the counters take that call's share.
template <class F>
void IpcCommunicator::on_host(const std::string& op, F&& f) {
  const auto get = [&] {
    const auto& c = impl_->host->counters();
    const auto it = c.find(op);
    return it == c.end() ? CommCounter{} : it->second;
  };
  const CommCounter a = get();
  f(*impl_->host);
  const CommCounter b = get();
  record(op, b.bytes_sent - a.bytes_sent, b.seconds - a.seconds);
}

// Whether an operation's buffers are on the device. A null buffer (an empty tensor on this rank)
// counts as either, so that every rank of a collective takes the same path.
static bool both_device(const void* a, const void* b) {
  return !(a && !is_device_pointer(a)) && !(b && !is_device_pointer(b));
}

void IpcCommunicator::all_to_all(const void* send, void* recv, std::int64_t count, DType dt) {
  if (!both_device(send, recv))
    return on_host("all_to_all", [&](Communicator& h) { h.all_to_all(send, recv, count, dt); });
  const double t0 = now_seconds();
  const std::size_t blk = dtype_bytes(count, dt);
  auto& I = *impl_;
  I.begin(blk * size_);
  I.copy(I.main.buf, send, blk * size_);
  I.ready();
  for (int p = 0; p < size_; ++p)
    I.copy(static_cast<char*>(recv) + p * blk, static_cast<const char*>(I.peer_buf(p)) + rank_ * blk, blk);
  I.end("all_to_all");
  record("all_to_all", count * (size_ - 1) * static_cast<std::int64_t>(dtype_size(dt)), now_seconds() - t0);
}

void IpcCommunicator::all_to_all_v(const void* send, const std::vector<std::int64_t>& sc, void* recv,
                                   const std::vector<std::int64_t>& rc, DType dt) {
  HCP_CHECK(static_cast<int>(sc.size()) == size_ && static_cast<int>(rc.size()) == size_, "all_to_all_v: need ", size_,
            " send and receive counts");
  if (!both_device(send, recv))
    return on_host("all_to_all_v", [&](Communicator& h) { h.all_to_all_v(send, sc, recv, rc, dt); });
  const double t0 = now_seconds();
  auto& I = *impl_;
  std::vector<std::int64_t> sd(static_cast<std::size_t>(size_)), theirs(static_cast<std::size_t>(size_));
  std::int64_t ns = 0, bytes = 0;
  for (int p = 0; p < size_; ++p) {
    sd[static_cast<std::size_t>(p)] = ns;
    ns += sc[static_cast<std::size_t>(p)];
    if (p != rank_) bytes += sc[static_cast<std::size_t>(p)];
  }
  I.begin(dtype_bytes(ns, dt));
  I.copy(I.main.buf, send, dtype_bytes(ns, dt));
  // The "ready" exchange carries where each rank's block for each peer starts in its buffer.
  I.ready([&] { HCP_MPI_CHECK(MPI_Alltoall(sd.data(), 1, MPI_INT64_T, theirs.data(), 1, MPI_INT64_T, I.sync)); });
  std::size_t ro = 0;
  for (int p = 0; p < size_; ++p) {
    const std::size_t n = dtype_bytes(rc[static_cast<std::size_t>(p)], dt);
    I.copy(static_cast<char*>(recv) + ro,
           static_cast<const char*>(I.peer_buf(p)) + dtype_bytes(theirs[static_cast<std::size_t>(p)], dt), n);
    ro += n;
  }
  I.end("all_to_all_v");
  record("all_to_all_v", bytes * static_cast<std::int64_t>(dtype_size(dt)), now_seconds() - t0);
}

void IpcCommunicator::all_gather(const void* send, void* recv, std::int64_t count, DType dt) {
  if (!both_device(send, recv))
    return on_host("all_gather", [&](Communicator& h) { h.all_gather(send, recv, count, dt); });
  const double t0 = now_seconds();
  const std::size_t blk = dtype_bytes(count, dt);
  auto& I = *impl_;
  I.begin(blk);
  I.copy(I.main.buf, send, blk);
  I.ready();
  for (int p = 0; p < size_; ++p) I.copy(static_cast<char*>(recv) + p * blk, I.peer_buf(p), blk);
  I.end("all_gather");
  record("all_gather", count * (size_ - 1) * static_cast<std::int64_t>(dtype_size(dt)), now_seconds() - t0);
}

void IpcCommunicator::reduce_scatter(const void* send, void* recv, std::int64_t count, DType dt, ReduceOp op) {
  if (!both_device(send, recv))
    return on_host("reduce_scatter", [&](Communicator& h) { h.reduce_scatter(send, recv, count, dt, op); });
  const double t0 = now_seconds();
  auto& I = *impl_;
  I.begin(dtype_bytes(count * size_, dt));
  I.copy(I.main.buf, send, dtype_bytes(count * size_, dt));
  I.ready();
  ipc::Sources s{};
  for (int p = 0; p < size_; ++p) s.p[p] = I.peer_buf(p);
  ipc::reduce(recv, s, size_, count, count * rank_, dt, op == ReduceOp::Sum, I.stream());
  I.end("reduce_scatter");
  record("reduce_scatter", count * (size_ - 1) * static_cast<std::int64_t>(dtype_size(dt)), now_seconds() - t0);
}

void IpcCommunicator::all_reduce(void* buf, std::int64_t count, DType dt, ReduceOp op) {
  if (!both_device(buf, nullptr))
    return on_host("all_reduce", [&](Communicator& h) { h.all_reduce(buf, count, dt, op); });
  const double t0 = now_seconds();
  auto& I = *impl_;
  I.begin(dtype_bytes(count, dt));
  I.copy(I.main.buf, buf, dtype_bytes(count, dt));
  I.ready();
  ipc::Sources s{};
  for (int p = 0; p < size_; ++p) s.p[p] = I.peer_buf(p);
  ipc::reduce(buf, s, size_, count, 0, dt, op == ReduceOp::Sum, I.stream());
  I.end("all_reduce");
  record("all_reduce", size_ > 1 ? 2 * count * (size_ - 1) / size_ * static_cast<std::int64_t>(dtype_size(dt)) : 0,
         now_seconds() - t0);
}

void IpcCommunicator::broadcast(void* buf, std::int64_t count, DType dt, int root) {
  if (!both_device(buf, nullptr))
    return on_host("broadcast", [&](Communicator& h) { h.broadcast(buf, count, dt, root); });
  const double t0 = now_seconds();
  auto& I = *impl_;
  const std::size_t n = dtype_bytes(count, dt);
  I.begin(rank_ == root ? n : 0);
  if (rank_ == root) I.copy(I.main.buf, buf, n);
  I.ready();
  if (rank_ != root) I.copy(buf, I.peer_buf(root), n);
  I.end("broadcast");
  record("broadcast", rank_ == root ? count * static_cast<std::int64_t>(dtype_size(dt)) : 0, now_seconds() - t0);
}

void IpcCommunicator::send(const void* buf, std::int64_t count, DType dt, int dst, int tag) {
  on_host("send", [&](Communicator& h) { h.send(buf, count, dt, dst, tag); });
}

void IpcCommunicator::recv(void* buf, std::int64_t count, DType dt, int src, int tag) {
  on_host("recv", [&](Communicator& h) { h.recv(buf, count, dt, src, tag); });
}

void IpcCommunicator::barrier() {
  on_host("barrier", [](Communicator& h) { h.barrier(); });
}

// A ring step on the channel of `tag`. Post: the neighbours trade their exports (dst learns this
// rank's, this rank learns src's, and dst's message says it has finished reading this rank's
// buffer in the previous step); the stream waits for that and copies `send` into the export.
// Wait: src says its data is in place; the stream copies it into `recv`.
RingRequest IpcCommunicator::ring_post(const void* send, void* recv, std::int64_t count, DType dt, int dst, int src,
                                       int tag) {
  HCP_CHECK(both_device(send, recv), "CUDA IPC ring_post needs device buffers");
  int* ub = nullptr;
  int has = 0;
  MPI_Comm_get_attr(impl_->sync, MPI_TAG_UB, &ub, &has);
  HCP_CHECK(tag >= 0 && (!has || static_cast<long>(tag) * 3 + 2 <= *ub), "ring tag ", tag, " out of range");
  RingRequest r;
  r.posted_at = now_seconds();
  auto& I = *impl_;
  Channel& ch = I.rings[tag];
  I.open(ch);
  const std::size_t n = dtype_bytes(count, dt);
  Impl::reserve(ch, n);
  Published from_src, from_dst;
  MPI_Request rq[4];
  HCP_MPI_CHECK(MPI_Irecv(&from_src, sizeof from_src, MPI_BYTE, src, 3 * tag, I.sync, &rq[0]));
  HCP_MPI_CHECK(MPI_Irecv(&from_dst, sizeof from_dst, MPI_BYTE, dst, 3 * tag + 1, I.sync, &rq[1]));
  HCP_MPI_CHECK(MPI_Isend(&ch.pub, sizeof ch.pub, MPI_BYTE, dst, 3 * tag, I.sync, &rq[2]));
  HCP_MPI_CHECK(MPI_Isend(&ch.pub, sizeof ch.pub, MPI_BYTE, src, 3 * tag + 1, I.sync, &rq[3]));
  HCP_MPI_CHECK(MPI_Waitall(4, rq, MPI_STATUSES_IGNORE));
  I.adopt(ch, dst, from_dst, dst == src);
  I.adopt(ch, src, from_src, true);
  I.order->begin();
  if (dst != rank_) I.wait(ch.peers[static_cast<std::size_t>(dst)].done);
  I.copy(ch.buf, send, n);
  HCP_CUDA_CHECK(cudaEventRecord(ch.ready, I.stream()));
  const std::int64_t h = I.next_handle++;
  I.inflight[h] = Ring{tag, dst, src, recv, n};
  r.handles.push_back(h);
  r.active = true;
  record("ring_post", static_cast<std::int64_t>(n), now_seconds() - r.posted_at);
  return r;
}

void IpcCommunicator::ring_wait(RingRequest& req) {
  HCP_CHECK(req.active, "ring_wait on a request that is not in flight");
  const double t0 = now_seconds();
  auto& I = *impl_;
  const auto it = I.inflight.find(req.handles.at(0));
  HCP_CHECK(it != I.inflight.end(), "ring_wait: unknown request");
  const Ring g = it->second;
  I.inflight.erase(it);
  Channel& ch = I.rings.at(g.tag);
  char token = 0, got = 0;
  HCP_MPI_CHECK(MPI_Sendrecv(&token, 1, MPI_BYTE, g.dst, 3 * g.tag + 2, &got, 1, MPI_BYTE, g.src, 3 * g.tag + 2, I.sync,
                             MPI_STATUS_IGNORE));
  I.order->check();
  const auto& from = ch.peers[static_cast<std::size_t>(g.src)];
  if (g.src != rank_) I.wait(from.ready);
  I.copy(g.recv, g.src == rank_ ? ch.buf : from.buf, g.bytes);
  HCP_CUDA_CHECK(cudaEventRecord(ch.done, I.stream()));
  I.order->end("ring step");
  req.active = false;
  record("ring_wait", 0, now_seconds() - t0);
}

std::unique_ptr<Communicator> IpcCommunicator::split(int color, int key) const {
  MPI_Comm sub;
  HCP_MPI_CHECK(MPI_Comm_split(impl_->sync, color, key, &sub));
  auto c = std::make_unique<IpcCommunicator>(sub);
  MPI_Comm_free(&sub);
  return c;
}

}  // namespace hcp
