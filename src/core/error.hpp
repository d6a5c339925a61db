// hybridcp core: the one error type and the check macros every layer uses.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace hcp {

// The project's single exception type. `what()` already names the place (file:line) and the rule.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_input_error(const std::string& where, const std::string& msg);

template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail
}  // namespace hcp

// HCP_CHECK(cond, parts...): throw hcp::Error("file:line: parts...") when cond is false.
#define HCP_CHECK(cond, ...)                                                                         \
  do {                                                                                               \
    if (!(cond)) ::hcp::detail::throw_error(__FILE__, __LINE__, ::hcp::detail::concat(__VA_ARGS__)); \
  } while (0)

#define HCP_FAIL(...) ::hcp::detail::throw_error(__FILE__, __LINE__, ::hcp::detail::concat(__VA_ARGS__))

// Bad input: the message opens with where the value came from (the deck's "file:line", or the
// "--set k=v" that gave it), not with a source location the user cannot act on.
#define HCP_INPUT_FAIL(where, ...) ::hcp::detail::throw_input_error(where, ::hcp::detail::concat(__VA_ARGS__))
#define HCP_INPUT_CHECK(cond, where, ...)                                                     \
  do {                                                                                        \
    if (!(cond)) ::hcp::detail::throw_input_error(where, ::hcp::detail::concat(__VA_ARGS__)); \
  } while (0)

// MPI: every call returning an error code goes through this.
#define HCP_MPI_CHECK(call)                                                                                   \
  do {                                                                                                        \
    int hcp_mpi_rc_ = (call);                                                                                 \
    if (hcp_mpi_rc_ != 0) {                                                                                   \
      ::hcp::detail::throw_error(__FILE__, __LINE__,                                                          \
                                 ::hcp::detail::concat("MPI call failed (code ", hcp_mpi_rc_, "): ", #call)); \
    }                                                                                                         \
  } while (0)

// HDF5: calls return a negative value (herr_t or hid_t) on failure.
#define HCP_H5_CHECK(call)                                                                                \
  ([&]() {                                                                                                \
    auto hcp_h5_rc_ = (call);                                                                             \
    if (hcp_h5_rc_ < 0)                                                                                   \
      ::hcp::detail::throw_error(__FILE__, __LINE__, ::hcp::detail::concat("HDF5 call failed: ", #call)); \
    return hcp_h5_rc_;                                                                                    \
  }())
