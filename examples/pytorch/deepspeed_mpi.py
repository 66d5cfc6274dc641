"""DeepSpeed ZeRO over the "perseus" torch.distributed backend, on the CPU, under mpirun.

    .venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch/deepspeed_mpi.py             # ZeRO-2
    .venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch/deepspeed_mpi.py --stage 0 1 2 3
    .venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch/deepspeed_mpi.py --backend gloo

deepspeed.init_distributed(dist_backend="perseus") after `import perseus.torch`, which
registers the backend: DeepSpeed finds rank and world size through MPI (mpi4py), as it
does under any mpirun, and makes torch's default process group over Perseus; ZeRO's
all-reduces, all-gathers and reduce-scatters then run on Perseus's engine. Launched
with plain mpirun, not the `deepspeed` launcher (which starts the ranks itself, over
ssh or pdsh).

On a machine without a GPU DeepSpeed needs its CPU accelerator: DS_ACCELERATOR=cpu,
which this script sets unless it is set already (DeepSpeed otherwise guesses from
what is installed). No compiled DeepSpeed op is needed: ZeRO 0-3 with a torch
optimizer run in Python. DeepSpeed's CPU back end would compile one op on first use
(deepspeed_shm_comm, about a minute, cached in ~/.cache/torch_extensions), which only
serves inference's all-reduce; this script skips it (skip_shm_op(); --shm-op builds
it). Tested with deepspeed==0.19.8 (scripts/setup.sh --all installs it).

Each --stage trains a fresh copy of the same MLP on scikit-learn's digits
(tool_digits.py), each rank on its half of every batch (DistributedSampler), with SGD
(ZeRO runs it on each rank's partition: "zero_allow_untested_optimizer") and without
DeepSpeed's default gradient clipping (to norm 1.0). Rank 0 prints the test
accuracy and whether every rank ends with the same weights (the job exits 1 if not);
--save PREFIX writes each stage's weights to PREFIX<stage>.pt.
"""
import importlib
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

import perseus.torch  # noqa: F401  registers the "perseus" backend
import deepspeed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tool_digits  # noqa: E402


def skip_shm_op():
    """Let DeepSpeed's torch back end start without its shared-memory op (see above).
    (deepspeed.comm.torch as an attribute is torch itself: deepspeed.comm imports it.)"""
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def train(stage, args, train_set, test_set):
    """One ZeRO-`stage` training -> (flat final weights, test accuracy)."""
    import torch.distributed as dist

    model = tool_digits.mlp()
    config = {"train_micro_batch_size_per_gpu": args.batch_size,
              "gradient_accumulation_steps": 1,
              "optimizer": {"type": "SGD", "params": {"lr": args.lr, "momentum": args.momentum}},
              "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True,
              # DeepSpeed clips gradients to norm 1.0 unless told; 0: off, as plain SGD
              "gradient_clipping": 0.0,
              "steps_per_print": 10 ** 9}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    sampler = DistributedSampler(train_set, num_replicas=dist.get_world_size(),
                                 rank=dist.get_rank(), shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank
        for x, y in loader:
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
        if dist.get_rank() == 0:
            print("ZeRO-%d epoch %d: last loss %.4f" % (stage, epoch + 1, loss.item()), flush=True)
    parameters = list(engine.module.parameters())
    # ZeRO-3 keeps a partition of each parameter per rank: gather them to read the model.
    with deepspeed.zero.GatheredParameters(parameters, enabled=stage == 3):
        weights = tool_digits.flat(parameters)
        accuracy = tool_digits.accuracy(engine.module, test_set)
    return weights, accuracy


def main():
    p = tool_digits.arguments("DeepSpeed ZeRO over perseus on the CPU, under mpirun",
                              save_help="rank 0 writes stage s's final weights to <SAVE><s>.pt")
    p.add_argument("--stage", type=int, nargs="+", default=[2], choices=[0, 1, 2, 3],
                   help="ZeRO stage(s): each trains the same model from the same start")
    p.add_argument("--shm-op", action="store_true", help="let DeepSpeed build its shm op")
    args = p.parse_args()
    torch.set_num_threads(1)  # one rank per core
    if not args.shm_op:
        skip_shm_op()
    deepspeed.utils.logger.setLevel("WARNING")

    deepspeed.init_distributed(dist_backend=args.backend)  # ranks from MPI (mpi4py)
    train_set, test_set = tool_digits.digits()
    same = True
    for stage in args.stage:
        weights, accuracy = train(stage, args, train_set, test_set)
        same &= tool_digits.check_and_report(
            weights, accuracy, "DeepSpeed ZeRO-%d, %d epoch(s)" % (stage, args.epochs),
            args.save and "%s%d.pt" % (args.save, stage))
    deepspeed.comm.destroy_process_group()
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
