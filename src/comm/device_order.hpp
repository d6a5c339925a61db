// The ordering core shared by the device communicators (NCCL, CUDA IPC). Each operation runs on a
// communication stream that first waits for the compute queued so far on the default stream; its
// end is an event that the default stream waits for. The host never blocks on a transfer: later
// compute is ordered after it on the device. A watchdog thread follows every end event: one that
// has not completed within the timeout, or an asynchronous error reported by the backend's probe,
// calls the backend's abort once, and the next operation on the host throws with the message.
#pragma once
#include <cuda_runtime.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hcp {

// True for device (or managed) memory; host and unregistered pointers are false.
bool is_device_pointer(const void* p);

class DeviceOrder {
 public:
  using Probe = std::function<std::string()>;  // "" while healthy, else the backend's error
  using Abort = std::function<void(const std::string& why)>;
  // An event recorded on the communication stream; it returns to the pool when the last holder
  // (the watchdog, a pending ring step) lets go.
  class Mark {
   public:
    Mark(DeviceOrder* o, cudaEvent_t e) : owner_(o), e_(e) {}
    ~Mark();
    Mark(const Mark&) = delete;
    Mark& operator=(const Mark&) = delete;
    cudaEvent_t event() const { return e_; }

   private:
    DeviceOrder* owner_;
    cudaEvent_t e_;
  };

  DeviceOrder(double timeout_s, Probe probe, Abort abort);
  ~DeviceOrder();  // waits for the stream, stops the watchdog
  DeviceOrder(const DeviceOrder&) = delete;
  DeviceOrder& operator=(const DeviceOrder&) = delete;

  cudaStream_t stream() const { return stream_; }
  // Throws the watchdog's message if it has fired; else the stream waits for the default stream's
  // work queued so far.
  void begin();
  // An event at this point of the stream, followed by the watchdog under the name `op`.
  std::shared_ptr<Mark> mark(const std::string& op);
  // The default stream waits for `m` (later compute sees the operation's results).
  static void default_waits(const Mark& m);
  // mark + default_waits: the usual end of an operation.
  void end(const std::string& op) { default_waits(*mark(op)); }
  // Blocks the host until the stream's work so far is done (for results the host reads), with the
  // watchdog's checks. Throws its message if it fires.
  void wait_host(const std::string& op);
  void synchronize();
  void check() const;  // throws the watchdog's message if it has fired

 private:
  friend class Mark;
  cudaEvent_t take_event();
  void give_event(cudaEvent_t e);
  void watch();
  struct Pending {
    std::shared_ptr<Mark> mark;
    std::string op;
    double deadline;
  };
  double timeout_s_;
  Probe probe_;
  Abort abort_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ = nullptr;  // recorded on the default stream by begin()
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::mutex pool_mu_;  // guards free_ alone: a Mark may die while mu_ is held
  std::vector<cudaEvent_t> free_;
  std::string failure_;  // the watchdog's message once it fired
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hcp
