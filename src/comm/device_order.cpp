#include "comm/device_order.hpp"

#include <chrono>

#include "core/clock.hpp"
#include "core/cuda_check.hpp"

namespace hcp {

bool is_device_pointer(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

DeviceOrder::Mark::~Mark() { owner_->give_event(e_); }

DeviceOrder::DeviceOrder(double timeout_s, Probe probe, Abort abort)
    : timeout_s_(timeout_s), probe_(std::move(probe)), abort_(std::move(abort)) {
  HCP_CUDA_CHECK(cudaGetDevice(&device_));
  HCP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  HCP_CUDA_CHECK(cudaEventCreateWithFlags(&compute_, cudaEventDisableTiming));
  thread_ = std::thread([this] { watch(); });
}

DeviceOrder::~DeviceOrder() {
  bool failed = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    failed = !failure_.empty();
  }
  if (!failed) cudaStreamSynchronize(stream_);  // after a failure the stream may never drain
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    pending_.clear();
  }
  cv_.notify_all();
  thread_.join();
  for (auto e : free_) cudaEventDestroy(e);
  cudaEventDestroy(compute_);
  cudaStreamDestroy(stream_);
}

cudaEvent_t DeviceOrder::take_event() {
  {
    std::lock_guard<std::mutex> g(pool_mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  HCP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void DeviceOrder::give_event(cudaEvent_t e) {
  std::lock_guard<std::mutex> g(pool_mu_);
  free_.push_back(e);
}

void DeviceOrder::check() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!failure_.empty()) HCP_FAIL(failure_);
}

void DeviceOrder::begin() {
  check();
  HCP_CUDA_CHECK(cudaEventRecord(compute_, cudaStreamLegacy));
  HCP_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_, 0));
}

std::shared_ptr<DeviceOrder::Mark> DeviceOrder::mark(const std::string& op) {
  auto m = std::make_shared<Mark>(this, take_event());
  HCP_CUDA_CHECK(cudaEventRecord(m->event(), stream_));
  {
    std::lock_guard<std::mutex> g(mu_);
    pending_.push_back({m, op, now_seconds() + timeout_s_});
  }
  cv_.notify_one();
  return m;
}

void DeviceOrder::default_waits(const Mark& m) { HCP_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamLegacy, m.event(), 0)); }

void DeviceOrder::wait_host(const std::string& op) {
  auto m = mark(op);
  while (true) {
    const cudaError_t q = cudaEventQuery(m->event());
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) HCP_FAIL(op, ": CUDA error while waiting: ", cudaGetErrorString(q));
    check();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void DeviceOrder::synchronize() {
  check();
  HCP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// The watchdog: events complete in stream order, so only the oldest pending one is polled.
void DeviceOrder::watch() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [this] { return stop_ || (!pending_.empty() && failure_.empty()); });
    if (stop_) return;
    const Pending p = pending_.front();
    lk.unlock();
    const cudaError_t q = cudaEventQuery(p.mark->event());
    std::string why;
    if (q == cudaSuccess) {
      lk.lock();
      if (!pending_.empty() && pending_.front().mark == p.mark) pending_.pop_front();
      continue;
    }
    if (q != cudaErrorNotReady) {
      why = p.op + ": CUDA error on the communication stream: " + cudaGetErrorString(q);
    } else if (const std::string e = probe_ ? probe_() : std::string(); !e.empty()) {
      why = p.op + " failed asynchronously (" + e + ")";
    } else if (now_seconds() > p.deadline) {
      why = p.op + " did not complete within " + std::to_string(static_cast<long>(timeout_s_)) +
            " s (a peer died or hangs)";
    }
    if (!why.empty()) {
      if (abort_) abort_(why);
      lk.lock();
      failure_ = why;
      pending_.clear();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lk.lock();
  }
}

}  // namespace hcp
