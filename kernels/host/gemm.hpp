// Row-major matrix products of the host kernels on the BLAS found at configure time (OpenBLAS on
// Debian, single-threaded: one rank per core), or on plain loops where no BLAS was found.
// Results are deterministic: the same shapes give the same order of sums on every call.
#pragma once
#include <cstdint>
#include <string>

namespace hcp::kernels::host {

// C[M,N] = alpha * op(A) * op(B) + beta * C, all row-major; op(X) = X or X^T (ta / tb).
// A is [M,K] (or [K,M] when ta) with row stride lda; B is [K,N] (or [N,K] when tb) with ldb.
// With K = 0, C = beta * C. beta = 0 overwrites C (its old values are never read).
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A,
          std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc);

}  // namespace hcp::kernels::host
