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
#                     Perseus, given a single-process command line as such scripts are
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
# Extra arguments go to the example, e.g. ./train.sh --fp16-allreduce --resume
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
    # The command line of a one-process run; under mpirun Perseus takes the ranks from MPI.
    args=(--synthetic-data -a "${ARCH:-resnet_small}" --epochs "${EPOCHS:-2}"
          --batch-size "${BATCH_SIZE:-32}" --lr "${LR:-0.1}" --momentum "${MOMENTUM:-0.9}"
          --weight-decay "${WEIGHT_DECAY:-1e-4}" --seed "${SEED:-42}"
          --dist-url tcp://127.0.0.1:88 --world-size 1 --rank 0)
    ;;
  *)
    echo "train.sh: unknown JOB=${JOB} (choose digits or imagenet_ddp)" >&2
    exit 2
    ;;
esac
if [ -n "${CHECKPOINT+set}" ]; then args+=(--checkpoint "$CHECKPOINT"); fi

exec "$PYTHON" "$HERE/examples/pytorch/$script" "${args[@]}" "$@"
