# Sourced by the scripts/gpu_*.sh from the checkout's root.
# gpu_setup NAME: $build (HCP_BUILD_DIR, default build-gpu) and $out (HCP_LOG_DIR, default
# $build/gpu-NAME, created), and Open MPI allowed to run as root and to oversubscribe.
gpu_setup() {
  build="${HCP_BUILD_DIR:-build-gpu}"
  out="${HCP_LOG_DIR:-$build/gpu-$1}"
  mkdir -p "$out"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
}

# gpu_build LOGDIR [TARGET ...] configures $build (Release, CUDA on,
# HCP_CMAKE_ARGS added) and builds the targets (all without any) with
# HCP_JOBS jobs (default: every core), logs in LOGDIR/{configure,build}.log; on a failure it prints
# the log's tail and exits 1.
gpu_build() {
  local logs="$1"
  shift
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  # shellcheck disable=SC2086
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHCP_WITH_CUDA=ON ${HCP_CMAKE_ARGS:-} \
    > "$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
  cmake --build "$build" -j "${HCP_JOBS:-$(nproc)}" "${targets[@]}" > "$logs/build.log" 2>&1 \
    || { tail -40 "$logs/build.log"; exit 1; }
}
