"""torch's own DistributedDataParallel and FSDP2 (fully_shard) over the "perseus"
backend on CUDA tensors (issue 47, point 2), each against one process training on
every rank's batch on the CPU (float64: the same to rounding); and the collectives they
use, on CUDA tensors, against values computed here (small integers: exact).

PTEST_GPU picks the device (gpu_torch_common.py): 'cuda' (this rank's GPU), 'cuda:0'
(every rank on GPU 0: NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1, or host-staged),
'cpu' (the script's own logic on the CPU: tests/gpu/test_gpu_tooling.py).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from common import log, main
from gpu_torch_common import init, synchronize

import perseus.torch  # noqa: F401 - registers the backend

STEPS = 3
ROWS = 4  # per rank and step


def check_collectives(rank, size, device):
    """all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor and an
    async all_reduce whose future is chained (what DDP's reducer and FSDP2 call)."""
    for dtype in (torch.float32, torch.float64, torch.int64):
        x = torch.arange(10, dtype=dtype, device=device) + rank
        dist.all_reduce(x)
        expected = torch.arange(10, dtype=dtype) * size + sum(range(size))
        assert torch.equal(x.cpu(), expected), ("all_reduce", dtype, x)
        b = torch.full((5,), rank, dtype=dtype, device=device)
        dist.broadcast(b, src=size - 1)
        assert torch.equal(b.cpu(), torch.full((5,), size - 1, dtype=dtype)), ("broadcast", dtype, b)
        gathered = torch.empty(3 * size, dtype=dtype, device=device)
        dist.all_gather_into_tensor(gathered, torch.full((3,), rank, dtype=dtype, device=device))
        expected = torch.arange(size, dtype=dtype).repeat_interleave(3)
        assert torch.equal(gathered.cpu(), expected), ("all_gather_into_tensor", dtype, gathered)
        chunk = torch.empty(2, dtype=dtype, device=device)
        dist.reduce_scatter_tensor(chunk, torch.arange(2 * size, dtype=dtype, device=device) * (rank + 1))
        expected = torch.arange(2 * rank, 2 * rank + 2, dtype=dtype) * (size * (size + 1) // 2)
        assert torch.equal(chunk.cpu(), expected), ("reduce_scatter_tensor", dtype, chunk)
    t = torch.ones(1000, device=device)
    future = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    assert torch.equal(future.wait().cpu(), torch.full((1000,), 2.0 * size)), "future chained"
    log("collectives of %s tensors: ok" % device.type)


def model():
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3)).double()


def batches(size):
    """Per step, every rank's (input, target); each rank trains on its own."""
    g = torch.Generator().manual_seed(3)
    return [[(torch.randn(ROWS, 6, generator=g, dtype=torch.float64),
              torch.randn(ROWS, 3, generator=g, dtype=torch.float64)) for _ in range(size)]
            for _ in range(STEPS)]


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def train(net, opt, data, rank, device):
    for step in data:
        x, y = (t.to(device) for t in step[rank])
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    synchronize()


def one_process(data, make_opt):
    """The parameters of one process on the CPU trained on every rank's batch."""
    net = model()
    opt = make_opt(net.parameters())
    train(net, opt, [[(torch.cat([x for x, _ in step]), torch.cat([y for _, y in step]))]
                     for step in data], 0, torch.device("cpu"))
    return [p.detach() for p in net.parameters()]


def compare(named, reference, device, what, full=lambda p: p):
    for (name, p), q in zip(named, reference):
        p = full(p).detach()
        assert p.device.type == device.type, "%s: %s on %s" % (what, name, p.device)
        torch.testing.assert_close(p.cpu(), q, rtol=1e-9, atol=1e-12,
                                   msg=lambda m: "%s: %s: %s" % (what, name, m))
    log("%s on %s: as one process on the whole batch" % (what, device.type))


def check_ddp(rank, size, device, data):
    """torch's DDP (its C++ reducer) over perseus: rank 0's weights at construction
    (the others start elsewhere), gradients averaged, SGD with momentum."""
    net = model()
    if rank:
        with torch.no_grad():
            for p in net.parameters():
                p.add_(rank)  # DDP's construction must broadcast rank 0's
    ddp = DDP(net.to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = sgd(ddp.parameters())
    train(ddp, opt, data, rank, device)
    compare(ddp.module.named_parameters(), one_process(data, sgd), device, "torch DDP")


def check_fsdp(rank, size, device, data):
    """fully_shard per layer and over the whole model, Adam."""
    net = model().to(device)
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    opt = adam(net.parameters())
    train(net, opt, data, rank, device)
    compare(net.named_parameters(), one_process(data, adam), device, "FSDP2",
            full=lambda p: p.full_tensor())


def body():
    rank, size, device = init(inputs_on_gpu=False)
    dist.init_process_group("perseus")
    assert dist.get_backend() == "perseus" and dist.get_world_size() == size
    check_collectives(rank, size, device)
    data = batches(size)
    check_ddp(rank, size, device, data)
    check_fsdp(rank, size, device, data)
    dist.destroy_process_group()


main(body)
