#include "comm/communicator.hpp"

namespace hcp {

static void require_host_contig(const Tensor& t, const char* what) {
  HCP_CHECK(t.defined() && t.is_contiguous(), what, ": tensor must be defined and contiguous");
}

void Communicator::all_to_all(const Tensor& send, Tensor& recv) {
  require_host_contig(send, "all_to_all send");
  require_host_contig(recv, "all_to_all recv");
  HCP_CHECK(send.numel() == recv.numel() && send.numel() % size() == 0 && send.dtype() == recv.dtype(),
            "all_to_all: send ", shape_str(send.shape()), " and recv ", shape_str(recv.shape()),
            " must have equal size divisible by ", size());
  all_to_all(send.raw(), recv.raw(), send.numel() / size(), send.dtype());
}

void Communicator::all_gather(const Tensor& send, Tensor& recv) {
  require_host_contig(send, "all_gather send");
  require_host_contig(recv, "all_gather recv");
  HCP_CHECK(recv.numel() == send.numel() * size() && send.dtype() == recv.dtype(), "all_gather: recv ",
            shape_str(recv.shape()), " must hold ", size(), " x send ", shape_str(send.shape()));
  all_gather(send.raw(), recv.raw(), send.numel(), send.dtype());
}

void Communicator::reduce_scatter(const Tensor& send, Tensor& recv, ReduceOp op) {
  require_host_contig(send, "reduce_scatter send");
  require_host_contig(recv, "reduce_scatter recv");
  HCP_CHECK(send.numel() == recv.numel() * size() && send.dtype() == recv.dtype(), "reduce_scatter: send ",
            shape_str(send.shape()), " must hold ", size(), " x recv ", shape_str(recv.shape()));
  reduce_scatter(send.raw(), recv.raw(), recv.numel(), send.dtype(), op);
}

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  require_host_contig(t, "all_reduce");
  all_reduce(t.raw(), t.numel(), t.dtype(), op);
}

void Communicator::broadcast(Tensor& t, int root) {
  require_host_contig(t, "broadcast");
  broadcast(t.raw(), t.numel(), t.dtype(), root);
}

Communicator& Communicator::block_of(int block) {
  if (block == size()) return *this;
  std::unique_ptr<Communicator>& c = blocks_[block];
  if (!c) {
    c = split_blocks(block);
    c->count_into(this);
  }
  return *c;
}

Communicator& Communicator::strided_of(int stride) {
  if (stride == 1) return *this;
  std::unique_ptr<Communicator>& c = strided_[stride];
  if (!c) {
    c = split_strided(stride);
    c->count_into(this);
  }
  return *c;
}

double Communicator::all_reduce_scalar(double v, ReduceOp op) {
  all_reduce(&v, 1, DType::F64, op);
  return v;
}

std::vector<double> Communicator::gather_to_root(double v) {
  std::vector<double> all(static_cast<std::size_t>(size()));
  all_gather(&v, all.data(), 1, DType::F64);
  return all;
}

}  // namespace hcp
