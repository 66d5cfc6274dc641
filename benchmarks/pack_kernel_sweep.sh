#!/usr/bin/env bash
# Times the pack kernel on this machine's GPU for several (chunk bytes, threads) pairs,
# on the ResNet-50 gradient set: benchmarks/pack_kernel_sweep.cu says what is measured.
# Needs nvcc and a GPU; run from the repository root. Efficiency = copy time / pack time.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -c "
import math, sys
sys.path.insert(0, 'benchmarks')
from resnet50_shapes import RESNET50_SHAPES
print('\n'.join(str(4 * math.prod(s)) for s in RESNET50_SHAPES))" >"$tmp/sizes.txt"
echo "chunk threads launches pack_us copy_us efficiency"
for chunk in ${CHUNKS:-32768 65536 131072 262144}; do
  for threads in ${THREADS:-256 512 1024}; do
    bin=$tmp/sweep_${chunk}_$threads
    "$NVCC" -O3 -std=c++17 -arch=compute_75 -Icsrc/src -Icsrc/include \
      -DPERSEUS_COPY_CHUNK_BYTES=${chunk}u -DPERSEUS_COPY_THREADS=$threads \
      -o "$bin" benchmarks/pack_kernel_sweep.cu &
  done
done
wait
for chunk in ${CHUNKS:-32768 65536 131072 262144}; do
  for threads in ${THREADS:-256 512 1024}; do
    "$tmp/sweep_${chunk}_$threads" <"$tmp/sizes.txt"
  done
done
