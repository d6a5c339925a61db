#!/usr/bin/env bash
# GPU check on a machine with an NVIDIA GPU, CUDA, NCCL, MPI and HDF5: configure with CUDA on,
# build the GPU tests, run them (CUDA kernels against the host kernels; NCCL and host-staged MPI
# communicators), then compute-sanitizer memcheck and racecheck on the kernel tests.
# Usage: scripts/gpu_check.sh   (HCP_BUILD_DIR default build-gpu, HCP_CMAKE_ARGS, HCP_JOBS; logs to
# $HCP_LOG_DIR when set; HCP_SANITIZE_FILTER, a gtest filter such as '*Ssd*:*Conv1d*', limits the
# sanitizer runs to the kernel tests that changed). Exit non-zero when a test fails or a sanitizer
# reports an error.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu_build.sh
gpu_setup logs
gpu_build "$out" test_cuda_kernels test_cuda_comm test_cuda_cp train_hybrid
grep -E "^-- hybridcp:" "$out/configure.log" || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
rc=0
ctest --test-dir "$build" -R "test_cuda" --output-on-failure 2>&1 | tee "$out/ctest.log" || rc=1
# Training on GPU ranks (2 ranks share the GPU: host-staged MPI) against its cp=1 replica.
mpirun -n 2 "$build/drivers/train_hybrid" --set run.device=cuda --set train.steps=12 --out "$out/train_gpu.h5" \
  > "$out/train_gpu.txt" 2>&1 && tail -3 "$out/train_gpu.txt" || { echo "train_hybrid on GPU ranks: FAILED"; tail -20 "$out/train_gpu.txt"; rc=1; }
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/test_cuda_kernels" \
      ${HCP_SANITIZE_FILTER:+--gtest_filter="$HCP_SANITIZE_FILTER"} > "$out/sanitizer_$tool.log" 2>&1 \
      && echo "compute-sanitizer $tool: clean ($(grep -c '^\[       OK \]' "$out/sanitizer_$tool.log") tests)" \
      || { echo "compute-sanitizer $tool: FAILED"; tail -30 "$out/sanitizer_$tool.log"; rc=1; }
  done
else
  echo "compute-sanitizer: not found (skipped)"
fi
exit $rc
