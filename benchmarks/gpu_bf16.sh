#!/usr/bin/env bash
# gpt2-small training throughput in bf16 on one GPU, JAX then torch, with the
# model-FLOPs utilization over the GPU's stated dense bf16 peak (default 989
# TFLOP/s: an H200 or H100 SXM) and over its measured 8192^2 bf16 matmul.
#
#   benchmarks/gpu_bf16.sh [WHEEL_DIR] [PEAK_TFLOPS]
#
# PRESET, BATCH, STEPS and ROUNDS in the environment change the run (a quick
# check on a CPU: PRESET=gpt2-tiny STEPS=2 ROUNDS=1).
#
# WHEEL_DIR: for a GPU machine that has JAX and PyTorch but not Keras (and no
# package index): wheels of keras, namex, optree and, for the side-by-side
# KerasHub figures, keras-hub with the kagglehub and kagglesdk it imports
# (they import protobuf too), fetched elsewhere with e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d wheels \
#     keras namex optree keras-hub kagglehub==1.0.2 kagglesdk==0.1.28
# They are installed into a temporary folder, not the machine's Python.
# KerasHub needs TensorFlow only for its tokenizers; without keras-hub the
# benchmark times kerasformer alone.
set -uo pipefail
cd "$(dirname "$0")/.."
wheels=${1:-}
peak=${2:-989}
if [ -n "$wheels" ]; then
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl || exit 1
  export PYTHONPATH="$site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
status=0
for backend in jax torch; do
  KERAS_BACKEND=$backend python3 benchmarks/train_throughput.py --preset "${PRESET:-gpt2-small}" --precision bf16 \
    --batch "${BATCH:-16}" --steps "${STEPS:-10}" --rounds "${ROUNDS:-3}" --peak-tflops "$peak" || status=1
done
exit $status
