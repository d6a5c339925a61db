#!/usr/bin/env bash
# Idempotent set-up: installs the Debian packages hybridcp needs (only those missing).
# Usage: scripts/setup.sh            (needs root or sudo; does nothing when all are present)
set -euo pipefail
pkgs=(build-essential cmake pkg-config
      openmpi-bin libopenmpi-dev
      libhdf5-openmpi-dev hdf5-tools
      libtrilinos-kokkos-dev libopenblas-serial-dev
      libgtest-dev clang-format clang-tidy
      libcli11-dev libtomlplusplus-dev
      python3-h5py python3-numpy python3-matplotlib
      slurm-wlm munge)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[setup] all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "[setup] installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "[setup] done"
