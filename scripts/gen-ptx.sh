#!/usr/bin/env bash
# Regenerate src/device/cuda/kernels.ptx, the reduction kernels compiled ahead of
# time, from the CUDA C source in src/device/cuda/kernels.rs. Needs NVRTC from the
# wheel CI pins (nvidia-cuda-nvrtc-cu12==12.9.86): its lib directory on
# LD_LIBRARY_PATH, or NVRTC_LIB=that directory (default: where .ci/run unpacks it).
# Commit the result; CI fails when the committed file drifts from the source.
set -euo pipefail
cd "$(dirname "$0")/.."
nvrtc_lib="${NVRTC_LIB:-$PWD/target/ci-cache/nvrtc/nvidia/cuda_nvrtc/lib}"
BRAID_REQUIRE_NVRTC=1 BRAID_WRITE_PTX=1 LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo test --lib --features cuda -- --exact device::cuda::nvrtc::tests::embedded_ptx_is_what_nvrtc_makes_of_the_source --nocapture
