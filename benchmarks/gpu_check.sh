#!/usr/bin/env bash
# d500's CUDA paths, checked in one call on a GPU machine (the device tool), from the repository root:
#   bash benchmarks/gpu_check.sh            # prints what it found; a copy lands in $OUT/gpu_check.log
# It needs only what the GPU image has (python3 with torch, onnx, onnxruntime, numpy, scikit-learn,
# pyyaml, ml_dtypes); d500 is used from the checkout (PYTHONPATH), not installed.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=${OUT:-/tmp}/gpu_check.log
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=$PWD D500_HOME=${D500_HOME:-/tmp/d500-home}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  nproc; uptime
  timeout "${GPU_CHECK_TIMEOUT:-450}" "$PY" benchmarks/gpu_check.py "$@"
  echo "gpu_check.py exit status $?"
} 2>&1 | grep -v -e "cpu_feature_guard" -e "absl::InitializeLog" -e "rebuild TensorFlow" | tee "$LOG"
