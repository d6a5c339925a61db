// The host GEMM: cblas_{s,d}gemm when the build found a BLAS (HCP_HAVE_BLAS), else loops in the
// order that streams rows of B (correct everywhere, an order of magnitude slower).
#include "kernels/host/gemm.hpp"

#include <climits>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#ifdef HCP_HAVE_BLAS
#include <cblas.h>
#endif
#ifdef HCP_BLAS_OPENBLAS
extern "C" char* openblas_get_config(void);
#endif

namespace hcp::kernels {
namespace host {
namespace {

// Scales C by beta (beta = 0 writes zeros, whatever C held).
template <class T>
void scale_c(std::int64_t M, std::int64_t N, T beta, T* C, std::int64_t ldc) {
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
}

#ifndef HCP_HAVE_BLAS
template <class T>
void gemm_loops(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, std::int64_t lda,
                const T* B, std::int64_t ldb, T* C, std::int64_t ldc) {
  for (std::int64_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    for (std::int64_t k = 0; k < K; ++k) {
      const T a = alpha * (ta ? A[k * lda + i] : A[i * lda + k]);
      if (tb)
        for (std::int64_t j = 0; j < N; ++j) c[j] += a * B[j * ldb + k];
      else
        for (std::int64_t j = 0; j < N; ++j) c[j] += a * B[k * ldb + j];
    }
  }
}
#endif

template <class T>
void gemm_t(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, std::int64_t lda,
            const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  HCP_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == T(0)) return scale_c(M, N, beta, C, ldc);
#ifdef HCP_HAVE_BLAS
  HCP_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
            "gemm: sizes beyond the BLAS's 32-bit integers (M=", M, " N=", N, " K=", K, ")");
  const auto op = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, op(ta), op(tb), i(M), i(N), i(K), alpha, A, i(lda), B, i(ldb), beta, C, i(ldc));
  else
    cblas_dgemm(CblasRowMajor, op(ta), op(tb), i(M), i(N), i(K), alpha, A, i(lda), B, i(ldb), beta, C, i(ldc));
#else
  scale_c(M, N, beta, C, ldc);
  gemm_loops(ta, tb, M, N, K, alpha, A, lda, B, ldb, C, ldc);
#endif
}

}  // namespace

void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  gemm_t(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A,
          std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc) {
  gemm_t(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace host

std::string host_blas() {
#if defined(HCP_BLAS_OPENBLAS)
  return openblas_get_config();  // "OpenBLAS 0.3.21 ... SINGLE_THREADED"
#elif defined(HCP_HAVE_BLAS)
  return "BLAS (" HCP_BLAS_LIBRARY ")";
#else
  return "none (built-in loops)";
#endif
}

}  // namespace hcp::kernels
