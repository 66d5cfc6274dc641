"""Hugging Face accelerate over the "perseus" torch.distributed backend, on the CPU,
under mpirun.

    .venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch/accelerate_mpi.py
    .venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch/accelerate_mpi.py --backend gloo

accelerate does not take "perseus" as its backend on the CPU: on a CPU run
(Accelerator(cpu=True), which a machine without a GPU needs for a distributed run)
it picks "mpi" where torch was built with MPI, else "gloo", and a backend passed in
(InitProcessGroupKwargs(backend="perseus")) is refused: "Your assigned backend
perseus is not available, please use gloo". What works: make the default process group
first, dist.init_process_group("perseus") after `import perseus.torch`, then create
the Accelerator. accelerate leaves a group that exists alone, takes rank and size from
it, and prepare() wraps the model in torch's DistributedDataParallel over it: the
gradients are averaged over Perseus. (accelerator.state.backend still says "gloo",
the backend accelerate would have picked; torch.distributed.get_backend() says
"perseus".) accelerate sees a distributed CPU run from MPI's variables (PMI_SIZE under
MPICH's mpirun, OMPI_COMM_WORLD_SIZE under Open MPI's), so no `accelerate launch` is
needed. On CUDA, where LOCAL_RANK is set, accelerate keeps the backend it is given,
so InitProcessGroupKwargs(backend="perseus") works there too (not run here: no GPU).

Trains a small MLP on scikit-learn's digits (tool_digits.py), each rank on its share
of every batch (prepare() shards the loader); rank 0 prints the test accuracy and
whether every rank ends with the same weights (the job exits 1 if not), and with
--save writes them. Tested with accelerate==1.15.0 (scripts/setup.sh --all installs it).
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader

import perseus.torch  # noqa: F401  registers the "perseus" backend
from accelerate import Accelerator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tool_digits  # noqa: E402


def main():
    args = tool_digits.arguments("accelerate over perseus on the CPU, under mpirun").parse_args()
    torch.set_num_threads(1)  # one rank per core

    if args.backend == "perseus":
        dist.init_process_group("perseus")  # before the Accelerator: ranks from MPI
    # (else accelerate makes its own group: gloo, or mpi where torch has it)
    accelerator = Accelerator(cpu=True)
    accelerator.print("accelerate: %d processes, %s; torch.distributed's backend: %s"
                      % (accelerator.num_processes, accelerator.distributed_type,
                         dist.get_backend()))

    train, test = tool_digits.digits()
    model = tool_digits.mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loader = DataLoader(train, batch_size=args.batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
        accelerator.print("epoch %d: last loss %.4f" % (epoch + 1, loss.item()))

    net = accelerator.unwrap_model(model)
    same = tool_digits.check_and_report(
        tool_digits.flat(net.parameters()), tool_digits.accuracy(net, test),
        "accelerate, %d epoch(s)" % args.epochs, args.save)
    accelerator.end_training()  # destroys the process group
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
