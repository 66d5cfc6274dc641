"""The fake GPU's device model (tests/gpu_fakes/fake_device.c) on its own, through the
fake NCCL's C functions (no Perseus; mpi4py starts MPI): two communicators, 'lane A'
and 'lane B', on every rank, each allreduce launched by a thread of its own, the
second only once the first is on the GPU.

DEVICE_CASE (every rank's result is checked against the sum computed here):
  opposite  even ranks launch A then B, odd ranks B then A. With FAKE_GPU_KERNEL_SLOTS=1
            both calls fail on every rank, the error naming the wait-for cycle: both
            calls, both lanes, the ranks; with 2 slots both succeed.
  same      every rank A then B: succeeds with 1 slot. With DEVICE_RACE=1 the
            communicators ask for launch order implicit (launchOrderImplicit=1), and the
            second launch, made while the first is in, is a launch race (a misuse).
  missing   odd ranks never launch B: B fails on the even ranks once the bounded wait
            (FAKE_GPU_DEVICE_TIMEOUT_S) is spent, naming the call.
"""
import ctypes
import os
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import fake_gpu  # noqa: E402
from support.rank_script import log, main  # noqa: E402

FLOAT32, SUM, COUNT = 7, 0, 1000


class Config(ctypes.Structure):  # NCCL 2.31's ncclConfig_t, as far as the fake reads it
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint)] + \
        [(n, ctypes.c_int) for n in ("blocking", "cgaClusterSize", "minCTAs", "maxCTAs")] + \
        [("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int), ("trafficClass", ctypes.c_int),
         ("commName", ctypes.c_char_p)] + \
        [(n, ctypes.c_int) for n in ("collnetEnable", "CTAPolicy", "shrinkShare", "nvlsCTAs",
                                     "nChannelsPerNetPeer", "nvlinkCentricSched", "graphUsageMode",
                                     "numRmaCtx", "maxP2pPeers", "graphStreamOrdering", "launchOrderImplicit",
                                     "numRmaSig", "rmaEagerInit", "hostCftMode", "nvlsHostMode")]


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def communicator(lib, comm_world, name):
    uid = UniqueId()
    if comm_world.rank == 0:
        assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
    ctypes.memmove(ctypes.addressof(uid), comm_world.bcast(bytes(uid), root=0), 128)
    lib.ncclCommInitRankConfig.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int,
                                           ctypes.POINTER(Config)]
    implicit = 1 if os.environ.get("DEVICE_RACE") == "1" else -2 ** 31  # NCCL_CONFIG_UNDEF_INT
    # blocking undefined, as NCCL_CONFIG_INITIALIZER leaves it (0 asks for a nonblocking one)
    config = Config(size=ctypes.sizeof(Config), magic=0xcafebeef, version=23100, commName=name.encode(),
                    blocking=-2 ** 31, launchOrderImplicit=implicit)
    comm = ctypes.c_void_p()
    rc = lib.ncclCommInitRankConfig(ctypes.byref(comm), comm_world.size, uid, comm_world.rank, ctypes.byref(config))
    assert rc == 0, "ncclCommInitRankConfig: %d" % rc
    return comm


def body():
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    case = os.environ["DEVICE_CASE"]
    lib = fake_gpu.lib()
    lib.ncclGetLastError.restype = ctypes.c_char_p
    lib.fake_gpu_device_kernels.restype = ctypes.c_long
    comms = {name: communicator(lib, world, name) for name in ("lane A", "lane B")}
    data = {name: (np.full(COUNT, rank + 1 + 10 * i, np.float32), np.zeros(COUNT, np.float32))
            for i, name in enumerate(comms)}
    outcome = {}

    def launch(name):
        send, recv = data[name]
        rc = lib.ncclAllReduce(ctypes.c_void_p(send.ctypes.data), ctypes.c_void_p(recv.ctypes.data),
                               ctypes.c_size_t(COUNT), FLOAT32, SUM, comms[name], None)
        outcome[name] = (rc, lib.ncclGetLastError(comms[name]).decode() if rc else "")

    order = ["lane A", "lane B"]
    if case == "opposite" and rank % 2:
        order.reverse()
    if case == "missing" and rank % 2:
        order = ["lane A"]
    threads = []
    if case == "same" and rank % 2:  # the even ranks' first call then waits, while their second is launched
        time.sleep(0.5)
    for name in order:
        if case == "missing":  # B's bounded wait starts once A is done
            for thread in threads:
                thread.join(90)
        threads.append(threading.Thread(target=launch, args=(name,), daemon=True))
        threads[-1].start()
        deadline = time.monotonic() + 30
        while lib.fake_gpu_device_kernels() < len(threads) and name not in outcome:
            assert time.monotonic() < deadline, "%s never reached the GPU" % name
            time.sleep(0.001)
    for thread in threads:
        thread.join(90)
        assert not thread.is_alive(), "a launch still waits after 90 s: the device model hung"
    log("outcome:", outcome)

    def right(name):
        i = list(comms).index(name)
        expected = sum(r + 1 + 10 * i for r in range(size))
        return outcome[name][0] == 0 and np.all(data[name][1] == expected)

    slots = int(os.environ.get("FAKE_GPU_KERNEL_SLOTS", "1"))
    misuse = fake_gpu.stats()
    if case == "opposite" and slots == 1:
        for name in comms:
            rc, why = outcome[name]
            assert rc == 3, (name, outcome)
            assert "wait-for cycle" in why and "launched these collectives in different orders" in why, why
            for call in ("ncclAllReduce #1 of 'lane A'", "ncclAllReduce #1 of 'lane B'"):
                assert call in why, (call, why)
            named = {r for r in range(size) if "rank %d " % r in why}
            assert len(named) >= 2 and any(r % 2 for r in named) and any(r % 2 == 0 for r in named), why
        assert misuse["misuses"] >= 1 and "wait-for cycle" in misuse["last_misuse"], misuse
    elif case == "missing":
        assert right("lane A"), outcome
        if rank % 2 == 0:
            rc, why = outcome["lane B"]
            assert rc == 3 and "no progress for" in why and "ncclAllReduce #1 of 'lane B'" in why, outcome
    else:
        assert all(right(name) for name in comms), outcome
        if os.environ.get("DEVICE_RACE") == "1" and rank % 2 == 0:
            assert misuse["misuses"] >= 1 and "launch race" in misuse["last_misuse"], misuse
        elif os.environ.get("DEVICE_RACE") != "1":
            assert misuse["misuses"] == 0, misuse
    for comm in comms.values():
        lib.ncclCommDestroy(comm)
    # After the destroys: destroying a failed communicator drains its messages over
    # MPI, which a peer that has already left ends with a kill of the job.
    world.Barrier()


if __name__ == "__main__":
    main(body)
