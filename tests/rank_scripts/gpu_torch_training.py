"""The PyTorch training surface on CUDA, each against single-process CPU training or
plain torch on the whole batch, through the CPU scripts' own helpers run with a device:

  * DistributedOptimizer (optimizer.py): plain, backward_passes_per_step=2, groups,
    num_groups, fp16 / bf16 compression; weights equal to CPU training on the whole
    batch (float64, 1e-9; compressed: close but not exact) and identical on every rank;
  * broadcast_parameters / broadcast_optimizer_state (broadcast_state.py): SGD and
    Adam, roots 0 and last, fresh and stepped, and a wrapped optimizer;
  * SyncBatchNorm (sync_batch_norm.py) against torch BatchNorm on the CPU over the
    concatenated batch, float64 and float32, 1-d to 3-d;
  * the drop-in DistributedDataParallel(model.cuda(), device_ids=[i]) (ddp_training.py)
    against CPU training on the whole batch: defaults, gradient_as_bucket_view,
    no_sync accumulation, one bucket per parameter.
TF32 is off, so float32 GPU math stays within the CPU scripts' tolerances.
"""
import torch

import broadcast_state
import ddp_training
import optimizer
import sync_batch_norm
from common import hvd, log, main
from gpu_torch_common import init

import perseus.torch.distributed as dist
from perseus.torch.compression import Compression


def on_cpu(weights, device, what):
    for w in weights:
        assert w.device == device, "%s: weights on %s, the model was on %s" % (what, w.device, device)
    return [w.cpu() for w in weights]


def distributed_optimizer(rank, size, device):
    ref = optimizer.reference()  # the CPU, one process, the whole batch
    cases = [
        ("average", {}, optimizer.TOL, False),
        ("passes2", {"passes": 2}, optimizer.TOL, False),
        ("groups", {"groups_of": lambda m: [[m.fc1.weight, m.fc2.weight], [m.fc1.bias]]},
         optimizer.TOL, False),
        ("num_groups", {"num_groups": 2}, optimizer.TOL, False),
        ("passes2_groups", {"passes": 2, "num_groups": 3}, optimizer.TOL, False),
        ("fp16", {"compression": Compression.fp16}, 2e-3, True),
        ("bf16", {"compression": Compression.bf16}, 2e-2, True),
    ]
    for what, kwargs, tol, lossy in cases:
        what = "cuda optimizer " + what
        got = optimizer.distributed(rank, size, device=device, **kwargs)
        optimizer.same_on_every_rank(got, what.replace(" ", "_"))
        worst = optimizer.compare(on_cpu(got, device, what), ref, tol, what, must_differ=lossy)
        if rank == 0:
            log("%s: max |diff| %.3g" % (what, worst))


def broadcasts(rank, size, device):
    for root in sorted({0, size - 1}):
        for name in ("sgd", "adam"):
            for root_steps in (0, 2):
                broadcast_state.check_optimizer(name, rank, size, root, root_steps, wrap=False, device=device)
        broadcast_state.check_optimizer("adam", rank, size, root, 0, wrap=True, device=device)


def sync_batch_norm_cases(rank, size, device):
    rows = sync_batch_norm.batch_patterns(size)["uneven"]
    for dtype in (torch.float64, torch.float32):
        for dims, trailings in sync_batch_norm.TRAILING.items():
            for trailing in trailings:
                if sum(rows) * max(1, int(torch.tensor(trailing).prod())) < 2:
                    continue  # one value per channel: no batch statistics
                for config in sync_batch_norm.CONFIGS[:2]:
                    sync_batch_norm.run_case(rank, size, dims, trailing, dtype, config, "uneven", rows,
                                             device=device)


def ddp(rank, size, device):
    dist.init_process_group()  # already running (hvd.init()): a no-op, as in a torch script
    ref = ddp_training.reference()
    cases = [
        ("defaults", {}),
        ("gradient_as_bucket_view", {"gradient_as_bucket_view": True}),
        ("no_sync", {"micro": 2}),
        ("one_bucket_per_param", {"bucket_cap_mb": 1e-6}),
    ]
    for what, kwargs in cases:
        what = "cuda DDP " + what
        got = ddp_training.train(rank, size, device=device, **kwargs)
        worst = ddp_training.compare(on_cpu(got, device, what), ref, ddp_training.TOL, what)
        if rank == 0:
            log("%s: max |diff| %.3g" % (what, worst))


def body():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rank, size, device = init(inputs_on_gpu=False)
    distributed_optimizer(rank, size, device)
    broadcasts(rank, size, device)
    sync_batch_norm_cases(rank, size, device)
    ddp(rank, size, device)
    hvd.shutdown()


main(body)
