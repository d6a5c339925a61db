// The study's clock (CUDA events on GPU ranks, MPI_Wtime on host ranks) and its printing helpers.
#include <mpi.h>

#include <cstdio>

#include "study.hpp"
#ifdef HCP_HAVE_CUDA
#include "kernels/cuda/runtime.hpp"
#endif

namespace hcp::drivers {

// ---- Clock ----------------------------------------------------------------------------------------
Clock::Clock(Space space) : space_(space) {}
Clock::~Clock() {
#ifdef HCP_HAVE_CUDA
  for (auto& [n, m] : marks_) cuda::event_release(m);
  if (start_) cuda::event_release(start_);
#endif
}
void Clock::start() {
  host_.clear();
  extra_.clear();
#ifdef HCP_HAVE_CUDA
  for (auto& [n, m] : marks_) cuda::event_release(m);
  marks_.clear();
  if (space_ == Space::Cuda) {
    if (start_) cuda::event_release(start_);
    start_ = cuda::event_mark();
    return;
  }
#endif
  t_ = MPI_Wtime();
}
void Clock::lap(const std::string& phase) {
#ifdef HCP_HAVE_CUDA
  if (space_ == Space::Cuda) {
    marks_.emplace_back(phase, cuda::event_mark());
    return;
  }
#endif
  const double t = MPI_Wtime();
  host_.emplace_back(phase, (t - t_) * 1e3);
  t_ = t;
}
std::vector<std::pair<std::string, double>> Clock::read() {
#ifdef HCP_HAVE_CUDA
  if (space_ == Space::Cuda) {
    std::vector<std::pair<std::string, double>> out;
    void* prev = start_;
    for (auto& [n, m] : marks_) {
      out.emplace_back(n, cuda::event_elapsed_ms(prev, m));
      prev = m;
    }
    out.insert(out.end(), extra_.begin(), extra_.end());
    return out;
  }
#endif
  std::vector<std::pair<std::string, double>> out = host_;
  out.insert(out.end(), extra_.begin(), extra_.end());
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += ',';
    s += x;
  }
  return s;
}
std::string join(const std::vector<std::int64_t>& v) {
  std::vector<std::string> t;
  for (auto x : v) t.push_back(std::to_string(x));
  return join(t);
}

// ---- Table ----------------------------------------------------------------------------------------
Table::Table(std::vector<std::pair<std::string, int>> columns) : cols_(std::move(columns)) {}
void Table::row(const std::vector<std::string>& cells) { rows_.push_back(cells); }
void Table::print() const {
  const auto line = [&](const std::vector<std::string>& cells, const char* lead) {
    std::string s = lead;
    for (std::size_t i = 0; i < cols_.size(); ++i) {
      const int w = cols_[i].second;
      const std::string& c = i < cells.size() ? cells[i] : std::string("-");
      char b[256];
      std::snprintf(b, sizeof b, i == 0 ? "%-*s" : " %*s", w, c.c_str());
      s += b;
    }
    std::printf("%s\n", s.c_str());
  };
  std::vector<std::string> head;
  for (const auto& [n, w] : cols_) head.push_back(n);
  line(head, "# ");
  for (const auto& r : rows_) line(r, "  ");
}
std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string fmt_int(std::int64_t v) { return std::to_string(v); }

}  // namespace hcp::drivers
