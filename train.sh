#!/usr/bin/env bash
# Per-rank training script, AIACC style: every rank of
#
#     mpirun -np 2 ./train.sh          (or: perseusrun -np 2 ./train.sh)
#
# runs this script, which starts the default training example,
# examples/pytorch/train_digits.py (an MLP on scikit-learn's digits), with the
# Python of ./.venv when there is one. Run on its own it trains on one rank.
#
# Settings, from the environment (mpirun passes it to every rank):
#   EPOCHS (20)  BATCH_SIZE (32, per rank)  LR (0.02, per rank; scaled by the rank count)
#   MOMENTUM (0.9)  WEIGHT_DECAY (1e-4)  SEED (42)  HIDDEN (128)
#   CHECKPOINT (${TMPDIR:-/tmp}/perseus-checkpoints/train_digits.pt; empty: none)
#   THREADS (1: torch threads per rank)  PYTHON (interpreter to use)
# Extra arguments go to the example, e.g. ./train.sh --fp16-allreduce --resume
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$HERE/.venv/bin/python" ]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
export OMP_NUM_THREADS="${THREADS:-${OMP_NUM_THREADS:-1}}"
export PYTHONUNBUFFERED=1

args=(--epochs "${EPOCHS:-20}" --batch-size "${BATCH_SIZE:-32}" --lr "${LR:-0.02}"
      --momentum "${MOMENTUM:-0.9}" --weight-decay "${WEIGHT_DECAY:-1e-4}"
      --seed "${SEED:-42}" --hidden "${HIDDEN:-128}")
if [ -n "${CHECKPOINT+set}" ]; then args+=(--checkpoint "$CHECKPOINT"); fi

exec "$PYTHON" "$HERE/examples/pytorch/train_digits.py" "${args[@]}" "$@"
