"""Device-kind mismatch (np >= 2): under one name, a CPU tensor on one rank and a CUDA
tensor on the others is the mismatch error on EVERY rank, naming the tensor, like a
dtype mismatch (errors.py does those on the CPU); so is a dtype mismatch between CUDA
tensors. The engine then serves CPU and CUDA requests as before."""
import torch

from common import assert_reduced, expect_raises, hvd, main, make_tensor
from gpu_torch_common import init


def body():
    rank, size, device = init(inputs_on_gpu=False)
    assert size >= 2, "a mismatch needs two ranks"
    odd = rank == size - 1
    cuda = torch.ones(6, device=device)
    cpu = torch.ones(6)
    cases = [
        ("gm.ar.cpu_vs_cuda", lambda n: hvd.allreduce(cpu if odd else cuda, name=n, op=hvd.Sum)),
        ("gm.ar.cuda_vs_cpu", lambda n: hvd.allreduce(cuda if rank == 0 else cpu, name=n, op=hvd.Sum)),
        ("gm.ar.async", lambda n: hvd.synchronize(hvd.allreduce_async(cpu if odd else cuda, name=n, op=hvd.Sum))),
        ("gm.ag", lambda n: hvd.allgather((cpu if odd else cuda).reshape(2, 3), name=n)),
        ("gm.bc", lambda n: hvd.broadcast(cpu if odd else cuda, 0, name=n)),
        ("gm.a2a", lambda n: hvd.alltoall(torch.ones(size * 2, device="cpu" if odd else device), name=n)),
        ("gm.rs", lambda n: hvd.reducescatter(torch.ones(size * 2, device="cpu" if odd else device), name=n,
                                              op=hvd.Sum)),
        ("gm.ar.cuda_dtype", lambda n: hvd.allreduce(cuda.double() if odd else cuda, name=n, op=hvd.Sum)),
    ]
    for name, call in cases:
        e = expect_raises(hvd.HorovodInternalError, name, call, name, contains=[name], within_s=30)
        assert isinstance(e, RuntimeError), name

    # Both kinds still work, also under the names that failed.
    for where in ("cpu", device):
        name = "gm.ar.cpu_vs_cuda"
        xs = [make_tensor("gm.after", r, (9,), torch.float32) for r in range(size)]
        out = hvd.allreduce(xs[rank].to(where), name=name, op=hvd.Sum)
        assert out.device == torch.device(where), "%s: result on %s" % (name, out.device)
        assert_reduced(out.cpu(), xs, hvd.Sum, torch.float32, "%s on %s after the mismatch" % (name, where))
    hvd.shutdown()


main(body)
