"""Point-to-point of CUDA tensors on the "perseus" torch backend (issue 48, part 2): send,
recv, isend, irecv with tags, every pair at once, batch_isend_irecv and a group, over
NCCL, against values each rank computes alone; then what is refused (on the rank that
calls it, never a hang: a receive from any rank, sizes that differ, named on both
sides, a peer that is this rank, a dtype Perseus lacks, a non-contiguous receive) and
the group's timeout bounding a receive nobody sends to, on either side of a pair.

Two ways to run it:
  * on the fake CUDA runtime and NCCL (FAKE_GPU_LIB set; tests/gpu/test_torch_p2p_cuda.py):
    a "CUDA tensor" is a CPU tensor that says it is on cuda:0 (the fake takes host
    memory for device memory) and torch's current stream is a fake stream. Before a
    send and before a receive, a framework kernel on that stream writes the tensor;
    after a receive's wait() one reads it, then the host. The fake's ordering checker
    fails the job, naming both, if a message was not ordered after the stream's work
    or the stream after the message; the fake NCCL fails a send and a receive whose
    sizes or number differ.
  * on real GPUs (no FAKE_GPU_LIB): CUDA tensors of this rank's GPU, with the current
    stream kept busy before each input is written (gpu_torch_common.busy), so a
    message that does not wait for the stream sends stale data.

P2P_REFUSED=<setup> checks only that a message fails on both ranks, saying why, where
NCCL cannot carry it: "shared_gpu" (ranks on one GPU, FAKE_GPU_PCI_BUS_ID set, with an
NCCL that refuses that) or "mpi_operations" (PERSEUS_GPU_OPERATIONS=mpi).
"""
import datetime
import os
import time

import torch
import torch.distributed as dist

from common import expect_raises, launcher_rank_size, log, main
from support import fake_gpu
from support.fake_torch_cuda import FakeCudaTensor, use_fake_current_stream

import perseus.torch  # noqa: F401 - registers the backend

RANK, SIZE = launcher_rank_size()
NEXT, PREV = (RANK + 1) % SIZE, (RANK - 1) % SIZE
FAKE = bool(os.environ.get("FAKE_GPU_LIB"))
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
SHAPES = ((), (0,), (7,), (3, 5), (64, 1025))


def value(rank, shape, dtype, salt=0):
    """What `rank` sends: different per rank, shape, dtype and salt (a CPU tensor)."""
    n = int(torch.Size(shape).numel())
    return ((torch.arange(n, dtype=torch.float64) * 7 + rank * 13 + salt) % 97).to(dtype).view(shape)


# ---- the device: fake or real ------------------------------------------------------

STREAM = None  # the fake's "current stream"


def setup_device():
    global STREAM
    if FAKE:
        STREAM = use_fake_current_stream()  # what perseus asks torch
    else:
        torch.cuda.set_device(RANK % torch.cuda.device_count())


def nbytes(t):
    return t.numel() * t.element_size()


def produce(t, values):
    """Writes `values` into device tensor `t` as the framework would: on the current
    stream, after other work there (fake: the checker sees a kernel write it)."""
    if FAKE:
        t.as_subclass(torch.Tensor).copy_(values)
        fake_gpu.kernel(0, STREAM, write=(t.data_ptr(), nbytes(t)))
    else:
        import gpu_torch_common
        gpu_torch_common.busy(5)
        t.copy_(values)


def device_tensor(values):
    """A device tensor holding `values`, written on the current stream."""
    if FAKE:
        t = torch.Tensor._make_subclass(FakeCudaTensor, torch.empty_like(values))
    else:
        t = torch.empty_like(values, device="cuda")
    produce(t, values)
    return t


def host(t):
    """A device tensor's values on the CPU, read after the current stream's work."""
    if not FAKE:
        return t.cpu()
    fake_gpu.kernel(0, STREAM, read=(t.data_ptr(), nbytes(t)))
    fake_gpu.host_sync(0, STREAM)
    fake_gpu.host_read(t.data_ptr(), nbytes(t))
    return t.as_subclass(torch.Tensor).clone()


def check(t, expected, what):
    got = host(t)
    assert got.dtype == expected.dtype and torch.equal(got, expected), \
        "%s: got %s, expected %s" % (what, got.flatten()[:8], expected.flatten()[:8])


# ---- what works --------------------------------------------------------------------

def ring(group=None, ranks=None):
    """Each member sends to the next and receives from the previous, with the blocking
    calls, every dtype and shape."""
    ranks = ranks or list(range(SIZE))
    me = ranks.index(RANK)
    nxt, prv = ranks[(me + 1) % len(ranks)], ranks[(me - 1) % len(ranks)]
    for dtype in DTYPES:
        for shape in SHAPES:
            out = device_tensor(value(RANK, shape, dtype))
            got = device_tensor(torch.zeros(shape, dtype=dtype))
            if me % 2 == 0:
                dist.send(out, nxt, group=group)
                dist.recv(got, prv, group=group)
            else:
                dist.recv(got, prv, group=group)
                dist.send(out, nxt, group=group)
            check(got, value(prv, shape, dtype), "ring %s %s from %d" % (dtype, shape, prv))
            produce(out, torch.zeros(shape, dtype=dtype))  # reused once the send's wait() returned


def tags():
    """Received in the other order than sent, each matched by its tag: a receiver that
    leads its pair (rank 0) and one that follows (rank 1)."""
    for receiver, sender in ((0, 1), (1, 0)):
        if RANK == receiver:
            late = device_tensor(torch.zeros(4))
            early = device_tensor(torch.zeros(4))
            w_late = dist.irecv(late, sender, tag=7)
            w_early = dist.irecv(early, sender, tag=5)
            w_early.wait()
            w_late.wait()
            check(early, value(sender, (4,), torch.float32, 5), "tag 5")
            check(late, value(sender, (4,), torch.float32, 7), "tag 7")
        elif RANK == sender:
            for tag in (5, 7):
                dist.isend(device_tensor(value(sender, (4,), torch.float32, tag)), receiver, tag=tag).wait()
        dist.barrier()


def every_pair_at_once():
    """Every rank sends to and receives from every other, all in flight together."""
    works, got = [], {}
    for peer in range(SIZE):
        if peer == RANK:
            continue
        got[peer] = device_tensor(torch.zeros(3, 300, dtype=torch.float64))
        works.append(dist.irecv(got[peer], peer, tag=9))
        works.append(dist.isend(device_tensor(value(RANK, (3, 300), torch.float64, peer)), peer, tag=9))
    for work in works:
        work.wait()
    for peer, t in got.items():
        check(t, value(peer, (3, 300), torch.float64, RANK), "from %d at once" % peer)


def batches():
    """batch_isend_irecv: both directions of the ring at once, two messages per pair of
    one tag (matched in posting order: at np 2 both go to the one peer)."""
    got_prev = device_tensor(torch.zeros(6, dtype=torch.int64))
    got_next = device_tensor(torch.zeros(6, dtype=torch.int64))
    ops = [dist.P2POp(dist.isend, device_tensor(value(RANK, (6,), torch.int64)), NEXT, tag=4),
           dist.P2POp(dist.isend, device_tensor(value(RANK, (6,), torch.int64, 1)), PREV, tag=4),
           dist.P2POp(dist.irecv, got_prev, PREV, tag=4),
           dist.P2POp(dist.irecv, got_next, NEXT, tag=4)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    check(got_prev, value(PREV, (6,), torch.int64), "batch from the previous rank")
    check(got_next, value(NEXT, (6,), torch.int64, 1), "batch from the next rank")


def collectives_between():
    """CUDA all_reduces (the device lanes' communicator) between messages (the pairs'):
    each done before the next starts: the fake's NCCL calls block their host thread until
    the peers' are made (on a GPU they only queue), so a message in flight beside a
    collective could deadlock the fake's threads."""
    for i in range(3):
        x = device_tensor(torch.full((5,), float(RANK + i)))
        dist.all_reduce(x)
        check(x, torch.full((5,), float(sum(range(SIZE)) + SIZE * i)), "all_reduce #%d" % i)
        ring_once("a message after all_reduce #%d" % i)


# ---- what is refused ---------------------------------------------------------------

def refusals():
    t = device_tensor(torch.zeros(2))
    expect_raises(NotImplementedError, "a receive from any rank", dist.recv, t,
                  contains=("any rank", "NCCL", "wildcard"))
    expect_raises(ValueError, "a send to itself", dist.isend, t, RANK, contains=("itself",))
    expect_raises(ValueError, "a peer outside the group", dist.send, t, SIZE)
    square = device_tensor(torch.zeros(4, 4))
    transposed = torch.Tensor._make_subclass(FakeCudaTensor, square.t()) if FAKE else square.t()
    expect_raises(ValueError, "a receive into a non-contiguous tensor", dist.irecv, transposed, PREV,
                  tag=13, contains=("contiguous",))
    expect_raises(ValueError, "a dtype Perseus lacks", dist.isend,
                  device_tensor(torch.zeros(3, dtype=torch.float8_e4m3fn)), NEXT, contains=("dtype",))
    # Sizes that differ: both sides fail, each naming both sizes, whichever leads.
    for sender, receiver, sent, room in ((0, 1, 5, 3), (1, 0, 2, 3)):
        if RANK == sender:
            expect_raises(ValueError, "a send the receiver has no room for", dist.send,
                          device_tensor(torch.zeros(sent)), receiver, tag=11,
                          contains=("rank %d receives into a tensor of %d bytes, this one has %d"
                                    % (receiver, 4 * room, 4 * sent), "nothing was sent"))
        elif RANK == receiver:
            expect_raises(ValueError, "a receive of another size", dist.recv,
                          device_tensor(torch.zeros(room)), sender, tag=11,
                          contains=("rank %d sends %d bytes into a tensor of %d"
                                    % (sender, 4 * sent, 4 * room),))
    dist.barrier()
    ring_once("after the refusals")


def ring_once(what, group=None, tag=0):
    """One message around the ring (one rank at np 2 sends first)."""
    out = device_tensor(value(RANK, (5,), torch.float32, 3))
    got = device_tensor(torch.zeros(5))
    works = [dist.irecv(got, PREV, group=group, tag=tag), dist.isend(out, NEXT, group=group, tag=tag)]
    for work in works:
        work.wait()
    check(got, value(PREV, (5,), torch.float32, 3), what)


def timeout_bounds_a_receive():
    """A group with a 1 s timeout: a receive nobody sends to fails after it, on the rank
    that leads the pair (0) and on the one that follows (1); the same tag then works."""
    group = dist.new_group(list(range(SIZE)), timeout=datetime.timedelta(seconds=1))
    if RANK in (0, 1):
        start = time.monotonic()
        expect_raises(RuntimeError, "a receive nobody sends to", dist.recv, device_tensor(torch.zeros(1)),
                      1 - RANK, group=group, tag=21,
                      contains=("recv from rank %d" % (1 - RANK), "timeout of 1 s"))
        assert time.monotonic() - start >= 0.9
    dist.barrier()
    ring_once("the withdrawn receives' tag", group, tag=21)
    ring(group)


def passed(what):
    """Fails at once, naming the fake's last misuse, if there was any (a race, sizes)."""
    if FAKE:
        fake_gpu.check_no_misuse(what)
    log(what, "ok")


def refused_setup(setup):
    """A message between ranks 0 and 1 fails on both, saying why, and the job goes on."""
    if setup == "mpi_operations":
        expected = (NotImplementedError, ("over NCCL", "PERSEUS_GPU_OPERATIONS=mpi", "CPU copy"))
    else:
        expected = (RuntimeError, ("Duplicate GPU", "NCCL_MULTI_RANK_GPU_ENABLE=1"))
    if RANK in (0, 1):
        call = dist.send if RANK == 0 else dist.recv
        expect_raises(expected[0], "a message NCCL cannot carry (%s)" % setup, call,
                      device_tensor(torch.zeros(3)), 1 - RANK, contains=expected[1])
    dist.barrier()


def body():
    dist.init_process_group("perseus")
    setup_device()
    if os.environ.get("P2P_REFUSED"):
        refused_setup(os.environ["P2P_REFUSED"])
        dist.destroy_process_group()
        return
    ring()
    passed("ring")
    tags()
    every_pair_at_once()
    batches()
    collectives_between()
    passed("tags, all pairs, batches, collectives between")
    if SIZE > 2:  # a group of the even ranks (global ranks given, as torch takes them)
        evens = list(range(0, SIZE, 2))
        group = dist.new_group(evens)
        if RANK in evens:
            ring(group, evens)
    else:
        group = dist.new_group([0, 1])
        ring(group)
    passed("group")
    refusals()
    timeout_bounds_a_receive()
    passed("refusals and timeout")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(body)
