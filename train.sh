#!/usr/bin/env bash
# Per-rank training script, AIACC style: every rank of
#
#     mpirun -np 2 ./train.sh          (or: perseusrun -np 2 ./train.sh)
#
# runs this script, which starts a training example with the Python of ./.venv
# when there is one. Run on its own it trains on one rank. JOB picks the example:
#   digits (default)  examples/pytorch/train_digits.py: an MLP on scikit-learn's
#                     digits with hvd.DistributedOptimizer
#   imagenet_ddp      examples/pytorch/imagenet_ddp.py: a torch DDP script (ImageNet
#                     style, synthetic images) with only its imports changed to
#                     Perseus; ranks and world size come from MPI
#
# Settings, from the environment (mpirun passes it to every rank):
#   EPOCHS (20; imagenet_ddp: 2)  BATCH_SIZE (32, per rank)
#   LR (0.02, per rank; scaled by the rank count; imagenet_ddp: 0.1)
#   MOMENTUM (0.9)  WEIGHT_DECAY (1e-4)  SEED (42)
#   HIDDEN (128, digits)  ARCH (resnet_small, imagenet_ddp: any model of models.py)
#   CHECKPOINT (digits: ${XDG_CACHE_HOME:-~/.cache}/perseus/checkpoints/train_digits.pt,
#               in a folder of the user's that only they may write;
#               imagenet_ddp: none; empty: none)
#   THREADS (1: torch threads per rank)  PYTHON (interpreter to use)
#   DEVICE (digits: auto = GPU local_rank where torch sees CUDA, cuda, or cpu)
# Extra arguments go to the example, e.g. ./train.sh --fp16-allreduce --resume;
# ./train.sh --help prints this, then the example's options.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$HERE/.venv/bin/python" ]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
# A check that imports nothing: Open MPI's mpirun, called by its full path, may put its
# own bin folder first on PATH, and then python3 is not the Python that has torch.
if ! "$PYTHON" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null; then
  echo "train.sh: $PYTHON ($(command -v "$PYTHON" || echo 'not found')) cannot import torch;" \
       "set PYTHON=/path/to/python (mpirun passes it to every rank) or create ./.venv" >&2
  exit 2
fi
export OMP_NUM_THREADS="${THREADS:-${OMP_NUM_THREADS:-1}}"
export PYTHONUNBUFFERED=1

case "${JOB:-digits}" in
  digits)
    script=train_digits.py
    args=(--epochs "${EPOCHS:-20}" --batch-size "${BATCH_SIZE:-32}" --lr "${LR:-0.02}"
          --momentum "${MOMENTUM:-0.9}" --weight-decay "${WEIGHT_DECAY:-1e-4}"
          --seed "${SEED:-42}" --hidden "${HIDDEN:-128}")
    ;;
  imagenet_ddp)
    script=imagenet_ddp.py
    # No --world-size/--rank: Perseus takes them from MPI. A one-process command line's
    # (--world-size 1 --rank 0) is accepted too, but contradicts a larger MPI job, so
    # every run warned on every rank.
    args=(--synthetic-data -a "${ARCH:-resnet_small}" --epochs "${EPOCHS:-2}"
          --batch-size "${BATCH_SIZE:-32}" --lr "${LR:-0.1}" --momentum "${MOMENTUM:-0.9}"
          --weight-decay "${WEIGHT_DECAY:-1e-4}" --seed "${SEED:-42}")
    ;;
  *)
    echo "train.sh: unknown JOB=${JOB} (choose digits or imagenet_ddp)" >&2
    exit 2
    ;;
esac
if [ -n "${CHECKPOINT+set}" ]; then args+=(--checkpoint "$CHECKPOINT"); fi
for arg in "$@"; do
  if [ "$arg" = -h ] || [ "$arg" = --help ]; then
    # The comment block at the top: train.sh's own settings (the example's --help
    # alone showed its options, not EPOCHS, JOB, ...).
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$HERE/train.sh"
    echo
    echo "examples/pytorch/$script (JOB=${JOB:-digits}), which the extra arguments reach:"
    exec "$PYTHON" "$HERE/examples/pytorch/$script" --help
  fi
done

exec "$PYTHON" "$HERE/examples/pytorch/$script" "${args[@]}" "$@"
