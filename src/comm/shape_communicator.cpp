#include "comm/shape_communicator.hpp"

#include <cstring>

#include "core/error.hpp"

namespace hcp {

ShapeCommunicator::ShapeCommunicator(int size, int rank) : size_(size), rank_(rank) {
  HCP_CHECK(size >= 1 && rank >= 0 && rank < size, "a shape group of ", size, " ranks has no rank ", rank);
}

void ShapeCommunicator::moves(const char* op) const {
  throw Error(std::string("internal: ") + op + " on a dry run's shape group of " + std::to_string(size_) +
              " ranks (building a case must not move data)");
}

void ShapeCommunicator::all_to_all(const void*, void*, std::int64_t, DType) { moves("all_to_all"); }
void ShapeCommunicator::all_to_all_v(const void*, const std::vector<std::int64_t>&, void*,
                                     const std::vector<std::int64_t>&, DType) {
  moves("all_to_all_v");
}
void ShapeCommunicator::reduce_scatter(const void*, void*, std::int64_t, DType, ReduceOp) { moves("reduce_scatter"); }
void ShapeCommunicator::send(const void*, std::int64_t, DType, int, int) { moves("send"); }
void ShapeCommunicator::recv(void*, std::int64_t, DType, int, int) { moves("recv"); }
RingRequest ShapeCommunicator::ring_post(const void*, void*, std::int64_t, DType, int, int, int) { moves("ring_post"); }
void ShapeCommunicator::ring_wait(RingRequest&) { moves("ring_wait"); }

void ShapeCommunicator::all_gather(const void* send, void* recv, std::int64_t count, DType dt) {
  const auto n = static_cast<std::size_t>(count) * dtype_size(dt);
  for (int k = 0; k < size_; ++k) std::memmove(static_cast<char*>(recv) + k * n, send, n);
}

void ShapeCommunicator::all_reduce(void*, std::int64_t, DType, ReduceOp op) {
  if (op != ReduceOp::Max) moves("a sum all_reduce");  // a sum over equal ranks would be size times this one
}

void ShapeCommunicator::broadcast(void*, std::int64_t, DType, int) {}

std::unique_ptr<Communicator> ShapeCommunicator::split(int, int) const { moves("split by colour"); }

std::unique_ptr<Communicator> ShapeCommunicator::split_blocks(int block) const {
  HCP_CHECK(block >= 1 && size_ % block == 0, "split_blocks(", block, ") of ", size_, " ranks");
  return std::make_unique<ShapeCommunicator>(block, rank_ % block);
}

std::unique_ptr<Communicator> ShapeCommunicator::split_strided(int stride) const {
  HCP_CHECK(stride >= 1 && size_ % stride == 0, "split_strided(", stride, ") of ", size_, " ranks");
  return std::make_unique<ShapeCommunicator>(size_ / stride, rank_ / stride);
}

}  // namespace hcp
