"""Point-to-point on the "perseus" torch backend (issue 48, part 2): send, recv, isend,
irecv, from any rank, with tags, batch_isend_irecv, send_object_list and
recv_object_list, in a group and the default group, against values each rank computes
alone; then what is refused (on the rank that calls it, never a hang) and the group's
timeout bounding a receive nobody sends to.
"""
import datetime
import time

import torch
import torch.distributed as dist

from common import expect_raises, launcher_rank_size, log, main

import perseus.torch  # noqa: F401 - registers the backend

RANK, SIZE = launcher_rank_size()
NEXT, PREV = (RANK + 1) % SIZE, (RANK - 1) % SIZE
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.uint8, torch.bool)
SHAPES = ((), (0,), (7,), (3, 5), (256, 1024))


def value(rank, shape, dtype, salt=0):
    """What `rank` sends: different per rank, shape, dtype and salt."""
    n = int(torch.Size(shape).numel())
    return ((torch.arange(n, dtype=torch.float64) * 7 + rank * 13 + salt) % 97).to(dtype).view(shape)


def ring(group=None, ranks=None):
    """Each member sends to the next and receives from the previous (group ranks)."""
    ranks = ranks or list(range(SIZE))
    me = ranks.index(RANK)
    nxt, prv = ranks[(me + 1) % len(ranks)], ranks[(me - 1) % len(ranks)]
    for dtype in DTYPES:
        for shape in SHAPES:
            got = torch.zeros(shape, dtype=dtype)
            if me % 2 == 0:
                dist.send(value(RANK, shape, dtype), nxt, group=group)
                dist.recv(got, prv, group=group)
            else:
                dist.recv(got, prv, group=group)
                dist.send(value(RANK, shape, dtype), nxt, group=group)
            assert torch.equal(got, value(prv, shape, dtype)), (dtype, shape)


def tags_any_source_and_batches():
    # Tags: received in the other order than sent, each matched by its tag.
    if RANK == 0:
        late, early = torch.zeros(4), torch.zeros(4)
        w_late = dist.irecv(late, 1, tag=7)
        w_early = dist.irecv(early, 1, tag=5)
        w_early.wait()
        w_late.wait()
        assert torch.equal(early, value(1, (4,), torch.float32, 5))
        assert torch.equal(late, value(1, (4,), torch.float32, 7))
    elif RANK == 1:
        for tag in (5, 7):
            dist.isend(value(1, (4,), torch.float32, tag), 0, tag=tag).wait()
    # Any source: recv() returns the sender.
    if RANK == 0:
        senders = []
        for _ in range(SIZE - 1):
            got = torch.zeros(3)
            source = dist.recv(got, tag=3)
            assert torch.equal(got, value(source, (3,), torch.float32)), source
            senders.append(source)
        assert sorted(senders) == list(range(1, SIZE)), senders
    else:
        dist.send(value(RANK, (3,), torch.float32), 0, tag=3)
    # batch_isend_irecv: both directions of the ring at once.
    got_prev, got_next = torch.zeros(6, dtype=torch.int64), torch.zeros(6, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, value(RANK, (6,), torch.int64), NEXT, tag=4),
           dist.P2POp(dist.isend, value(RANK, (6,), torch.int64, 1), PREV, tag=4),
           dist.P2POp(dist.irecv, got_prev, PREV, tag=4),
           dist.P2POp(dist.irecv, got_next, NEXT, tag=4)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if SIZE > 2:
        assert torch.equal(got_prev, value(PREV, (6,), torch.int64))
        assert torch.equal(got_next, value(NEXT, (6,), torch.int64, 1))
    # Objects.
    objects = [{"step": 3, "ranks": list(range(SIZE))}, "text", 2.5]
    if RANK == 0:
        for dst in range(1, SIZE):
            dist.send_object_list(objects, dst=dst)
    else:
        got = [None] * 3
        dist.recv_object_list(got, src=0)
        assert got == objects, got


def refusals():
    expect_raises(ValueError, "send to self", dist.send, torch.zeros(2), RANK,
                  contains=("rank",))
    expect_raises(ValueError, "a peer outside the group", dist.send, torch.zeros(2), SIZE)
    # A message larger than the receiver's tensor: an error there, naming both.
    if RANK == 0:
        dist.send(torch.zeros(5), 1, tag=11)
    elif RANK == 1:
        expect_raises(ValueError, "a short receive", dist.recv, torch.zeros(3), 0, tag=11,
                      contains=("larger than the 12-byte tensor",))
    # A message smaller than it.
    if RANK == 0:
        dist.send(torch.zeros(2), 1, tag=12)
    elif RANK == 1:
        expect_raises(ValueError, "a long receive", dist.recv, torch.zeros(3), 0, tag=12,
                      contains=("sent 8 bytes into a tensor of 12",))
    expect_raises(ValueError, "a non-contiguous receive", dist.recv,
                  torch.zeros(4, 4).t(), PREV, tag=13, contains=("contiguous",))
    dist.barrier()


def timeout_bounds_a_receive():
    """A group with a 1 s timeout: a receive nobody sends to fails after it, naming the
    peer; the group still works afterwards."""
    group = dist.new_group(list(range(SIZE)), timeout=datetime.timedelta(seconds=1))
    if RANK == 0:
        start = time.monotonic()
        expect_raises(RuntimeError, "a receive nobody sends to", dist.recv, torch.zeros(1),
                      1, group=group, tag=21, contains=("recv from rank 1", "timeout of 1 s"))
        assert time.monotonic() - start >= 0.9
    dist.barrier()
    ring(group)


def body():
    dist.init_process_group("perseus")
    ring()
    log("ring ok")
    tags_any_source_and_batches()
    log("tags, any source, batches, objects ok")
    if SIZE > 2:  # a group of the even ranks (global ranks given, as torch takes them)
        evens = list(range(0, SIZE, 2))
        group = dist.new_group(evens)
        if RANK in evens:
            ring(group, evens)
    refusals()
    timeout_bounds_a_receive()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(body)
