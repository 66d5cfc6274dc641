"""The job of tests/launch/test_multi_host.py, run twice at np 4: on two namespace hosts of two
ranks each (perseusrun -np 4 -H hostA:2,hostB:2, PTEST_HOSTS=2) and on one host (plain
mpirun, PTEST_HOSTS=1), so that the test can compare the results bit for bit.

Each part runs its collectives, checks every result against a plain-torch reference,
and hashes the bytes of every result in order: each rank prints
`DIGEST <rank> <part> <sha256>`. Parts: the collectives (allreduce over dtypes, ops,
sizes and scaling; grouped allreduce; allgather; broadcast from every root; alltoall;
reducescatter), process sets (within a host, across hosts, uneven), DistributedOptimizer
and drop-in DDP training (float64 weights against one-process training), and
hierarchical allreduce (after a re-init with PERSEUS_ALLREDUCE_MODE=hierarchical: on
one host with PERSEUS_RANKS_PER_NODE=2, simulated nodes of the same shape).

PTEST_PARTS picks parts (default: all, in that order). On the hosts the job also
checks the topology (local_size 2, cross_size 2, ranks 0-1 on one hostname and 2-3 on
another) and what crosses the network: local rank 0 of each host reads its eth0 byte
counters (the host's own network namespace) around one large allreduce, flat and then
hierarchical, and prints `TRAFFIC <host> <mode> <bytes sent>`.
"""
import hashlib
import os
import socket

import torch

from common import (assert_close, assert_equal, assert_reduced, dtype_name, hvd, init, kind_for,
                    log, main, make_tensor, op_name, reference_reduce, split_rows)
import ddp_training
import optimizer

HOSTS = int(os.environ["PTEST_HOSTS"])
PARTS = os.environ.get("PTEST_PARTS", "collectives process_sets training hierarchical").split()
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
DTYPES = FLOATS + [torch.int32, torch.int64]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
# 1 element, fewer than the ranks, odd, and more than one MPI piece of 64 KiB.
SHAPES = [(1,), (3,), (5, 201), (70001,)]
# On process sets: fewer cases (each set repeats them).
SET_DTYPES, SET_OPS = [torch.float32, torch.bfloat16, torch.int64], [hvd.Sum, hvd.Average]
TRAINING_STEPS = 10
TRAFFIC_ELEMENTS = 1 << 21  # an 8 MiB float32 allreduce


class Digest:
    def __init__(self, part):
        self.part, self.hash = part, hashlib.sha256()

    def add(self, tensor):
        self.hash.update(str((tensor.dtype, tuple(tensor.shape))).encode())
        self.hash.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
        return tensor

    def done(self):
        log("DIGEST %d %s %s" % (hvd.rank(), self.part, self.hash.hexdigest()))


def allreduces(rank, size, digest, tag, members=None, process_set=None, dtypes=DTYPES, ops=OPS):
    members = members or list(range(size))
    me = members.index(rank)
    kw = {} if process_set is None else {"process_set": process_set}
    for dtype in dtypes:
        for op in ops:
            for shape in SHAPES:
                what = "%s.%s.%s.%s" % (tag, dtype_name(dtype), op_name(op), "x".join(map(str, shape)))
                xs = [make_tensor(what, r, shape, dtype, kind_for(op)) for r in members]
                got = digest.add(hvd.allreduce(xs[me], name=what, op=op, **kw))
                assert_reduced(got, xs, op, dtype, what)
        what = "%s.%s.scaled" % (tag, dtype_name(dtype))
        if dtype.is_floating_point:
            xs = [make_tensor(what, r, (70001,), dtype) for r in members]
            got = digest.add(hvd.allreduce(xs[me], name=what, op=hvd.Sum, prescale_factor=0.5,
                                           postscale_factor=3.0, **kw))
            assert_reduced(got, xs, hvd.Sum, dtype, what, prescale=0.5, postscale=3.0)
    what = tag + ".group"
    groups = [[make_tensor("%s.%d" % (what, i), r, s, torch.float32) for r in members]
              for i, s in enumerate(SHAPES)]
    for i, got in enumerate(hvd.grouped_allreduce([xs[me] for xs in groups], name=what,
                                                  op=hvd.Sum, **kw)):
        assert_reduced(digest.add(got), groups[i], hvd.Sum, torch.float32, "%s.%d" % (what, i))


def data_movement(rank, size, digest, tag, members=None, process_set=None):
    members = members or list(range(size))
    me, n = members.index(rank), len(members)
    kw = {} if process_set is None else {"process_set": process_set}
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        name = "%s.allgather.%s" % (tag, dtype_name(dtype))
        xs = [make_tensor(name, r, (1 + 2 * i, 3), dtype) for i, r in enumerate(members)]
        assert_equal(digest.add(hvd.allgather(xs[me], name=name, **kw)), torch.cat(xs), name)
        for root in range(n):
            name = "%s.broadcast.%s.%d" % (tag, dtype_name(dtype), root)
            x = make_tensor(name, members[root], (1000,), dtype)
            mine = x if me == root else torch.zeros_like(x)
            got = hvd.broadcast(mine, members[root], name=name, **kw)  # a global rank
            assert_equal(digest.add(got), x, name)
        name = "%s.alltoall.%s" % (tag, dtype_name(dtype))
        splits = [[(s + 2 * d) % 3 for d in range(n)] for s in range(n)]
        xs = [make_tensor(name, r, (sum(splits[i]), 2), dtype) for i, r in enumerate(members)]
        out, received = hvd.alltoall(xs[me], splits=splits[me], name=name, **kw)
        expected = torch.cat([xs[s][sum(splits[s][:me]):sum(splits[s][:me + 1])] for s in range(n)])
        assert_equal(digest.add(out), expected, name)
        assert [int(v) for v in received] == [splits[s][me] for s in range(n)], name
    for op in (hvd.Sum, hvd.Average):
        for dtype in (torch.float32, torch.float64, torch.int32):
            name = "%s.reducescatter.%s.%s" % (tag, op_name(op), dtype_name(dtype))
            xs = [make_tensor(name, r, (2 * n + 1, 3), dtype) for r in members]
            got = digest.add(hvd.reducescatter(xs[me], name=name, op=op, **kw))
            expected, bound = reference_reduce(xs, op, dtype)
            rows = split_rows(2 * n + 1, n)
            mine = slice(sum(rows[:me]), sum(rows[:me + 1]))
            assert_close(got, expected[mine], None if bound is None else bound[mine], dtype, name)


def collectives(rank, size):
    digest = Digest("collectives")
    allreduces(rank, size, digest, "mh")
    data_movement(rank, size, digest, "mh")
    digest.done()


def process_sets(rank, size):
    digest = Digest("process_sets")
    # Within hostA, across the hosts (local rank 0 of each), and uneven (2 + 1).
    for members in ([0, 1], [0, 2], [1, 2, 3]):
        ps = hvd.add_process_set(members)
        if rank in members:
            assert ps.size() == len(members) and ps.rank() == members.index(rank)
            tag = "mh.set" + "".join(map(str, members))
            allreduces(rank, size, digest, tag, members, ps, SET_DTYPES, SET_OPS)
            data_movement(rank, size, digest, tag, members, ps)
        hvd.remove_process_set(ps)
    digest.done()


def training(rank, size):
    digest = Digest("training")
    optimizer.STEPS = TRAINING_STEPS
    got = optimizer.distributed(rank, size, make_opt=optimizer.adam)
    optimizer.compare(got, optimizer.reference(optimizer.adam), optimizer.TOL, "optimizer")
    for w in got:
        digest.add(w)
    got = ddp_training.train(rank, size)
    ddp_training.compare(got, ddp_training.reference(), ddp_training.TOL, "ddp")
    for w in got:
        digest.add(w)
    digest.done()


def eth0_sent():
    """Bytes this host's eth0 has sent (the rank's network namespace is its host's)."""
    with open("/proc/self/net/dev") as f:
        for line in f:
            name, sep, fields = line.partition(":")
            if sep and name.strip() == "eth0":
                return int(fields.split()[8])
    raise AssertionError("no eth0 in /proc/self/net/dev")


def traffic(rank, size, mode):
    """The bytes this host sent during one large allreduce, printed by local rank 0."""
    x = make_tensor("mh.traffic", rank, (TRAFFIC_ELEMENTS,), torch.float32)
    hvd.barrier()
    before = eth0_sent()
    hvd.allreduce(x, name="mh.traffic." + mode, op=hvd.Sum)
    hvd.barrier()
    sent = eth0_sent() - before
    if hvd.local_rank() == 0:
        log("TRAFFIC %s %s %d" % (socket.gethostname(), mode, sent))


def topology(rank, size):
    assert size == 4, "expected 4 ranks, got %d" % size
    assert (hvd.local_size(), hvd.cross_size()) == (2, 2), \
        "local_size %d, cross_size %d: expected 2 and 2" % (hvd.local_size(), hvd.cross_size())
    assert (hvd.local_rank(), hvd.cross_rank()) == (rank % 2, rank // 2), \
        "rank %d: local_rank %d, cross_rank %d" % (rank, hvd.local_rank(), hvd.cross_rank())
    names = hvd.allgather_object(socket.gethostname())
    assert names[0] == names[1] != names[2] == names[3], "hostnames by rank: %s" % names
    log("HOST %d %s" % (rank, names[rank]))


def hierarchical(rank, size):
    hvd.shutdown()
    os.environ["PERSEUS_ALLREDUCE_MODE"] = "hierarchical"
    if HOSTS == 1:
        os.environ["PERSEUS_RANKS_PER_NODE"] = "2"
    init()
    assert hvd.config()["PERSEUS_ALLREDUCE_MODE"] == "hierarchical", hvd.config()
    digest = Digest("hierarchical")
    allreduces(rank, size, digest, "mh.hier")
    digest.done()


def body():
    rank, size = init()
    if HOSTS == 2:
        topology(rank, size)
        traffic(rank, size, "flat")
    for part in PARTS:
        PART_FUNCTIONS[part](rank, size)
    if HOSTS == 2 and "hierarchical" in PARTS:
        traffic(rank, size, "hierarchical")
    hvd.shutdown()


PART_FUNCTIONS = {"collectives": collectives, "process_sets": process_sets, "training": training,
                  "hierarchical": hierarchical}


if __name__ == "__main__":
    main(body)
