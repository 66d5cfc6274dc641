"""PyTorch Lightning over the "perseus" torch.distributed backend, launched with mpirun.

    .venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch/lightning_mpi.py
    .venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch/lightning_mpi.py --backend gloo

Lightning's own DDPStrategy, given process_group_backend="perseus", with its
MPIEnvironment: each rank learns its rank, the world size and its local rank from MPI
(mpi4py), and Trainer.fit() makes the default process group over Perseus. The one
thing Perseus adds is `import perseus.torch`, which registers the backend; Lightning's
DDP (torch's DistributedDataParallel) then averages the gradients over it.
--backend gloo runs the same training over gloo, for comparison.

Trains a small MLP on scikit-learn's handwritten digits (tool_digits.py), each rank on
its half of every batch (Lightning adds a DistributedSampler, which shuffles the
training data); rank 0 prints the test accuracy and whether every rank ends
with the same weights (the job exits 1 if not), and with --save writes them (one flat
float32 tensor) for comparison with another run. Needs `pip install
pytorch-lightning==2.6.6` (scripts/setup.sh --all installs it; the `lightning` package
works too).
"""
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import perseus.torch  # noqa: F401  registers the "perseus" backend

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import MPIEnvironment
except ImportError:
    import pytorch_lightning as pl
    from pytorch_lightning.plugins.environments import MPIEnvironment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tool_digits  # noqa: E402


class Digits(pl.LightningModule):
    def __init__(self, lr, momentum):
        super().__init__()
        self.net = tool_digits.mlp()
        self.lr, self.momentum = lr, momentum

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


def main():
    args = tool_digits.arguments("Lightning's DDPStrategy over perseus, under mpirun").parse_args()
    torch.set_num_threads(1)  # one rank per core
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    environment = MPIEnvironment()  # rank, world size, local rank from MPI
    from mpi4py import MPI
    local_size = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size()  # ranks per node
    train, test = tool_digits.digits()
    loader = DataLoader(train, batch_size=args.batch_size)  # Lightning adds the sampler
    trainer = pl.Trainer(
        accelerator="cpu", devices=local_size, num_nodes=environment.world_size() // local_size,
        strategy=pl.strategies.DDPStrategy(process_group_backend=args.backend,
                                           cluster_environment=environment),
        max_epochs=args.epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False)
    module = Digits(args.lr, args.momentum)
    trainer.fit(module, loader)

    weights = tool_digits.flat(module.net.parameters())
    same = tool_digits.check_and_report(weights, tool_digits.accuracy(module.net, test),
                                        "Lightning DDPStrategy, %d epoch(s)" % args.epochs,
                                        args.save)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
