"""Lifecycle and topology: init/shutdown, ranks and sizes, what this build has.

Framework-neutral; every adapter re-exports these under Horovod's names. Queries
go to the core each time (no Python cache), so before init() or after shutdown()
they raise the core's NOT_INITIALIZED as a ValueError.
"""

import atexit
import ctypes
import os

from perseus.common import builder as _builder
from perseus.common import exit_report as _exit_report
from perseus.common import launch_check as _launch_check
from perseus.common import library as _lib
from perseus.common import objects as _objects
from perseus.common import process_sets as _process_sets
from perseus.common import requests as _requests


def init(comm=None, process_sets=None):
    """Starts Perseus (and MPI, unless the application already initialized it).

    comm: None (or an empty list) for MPI_COMM_WORLD; an mpi4py communicator to
        run on its ranks; or a list of ranks, accepted only when it names every
        rank (for a subset, pass an mpi4py communicator, e.g. from
        MPI.COMM_WORLD.Split).
    process_sets: ProcessSet objects (or rank lists) to register right after init,
        in the same order on every rank: ids 1, 2, ... as given, or each rank's
        ProcessSet of its own mpi4py communicator (e.g. from MPI.COMM_WORLD.Split),
        whose sets get ids first, as Horovod (process_sets.add_process_sets). A
        duplicate (a set twice, or the global set's ranks) raises ValueError.
        Horovod's "dynamic" mode is not supported.

    Calling init() again while initialized only registers the given process sets
    (those registered already keep their ids).
    """
    if isinstance(process_sets, str):
        raise NotImplementedError("process_sets=%r is not supported by Perseus; pass a list "
                                  "of ProcessSet objects or rank lists" % (process_sets,))
    check_ranks = None
    if comm is None:
        comm_f2c = -1
    elif hasattr(comm, "py2f"):
        # The Fortran handle's 32 bits, as a non-negative number: MPICH's handles of
        # derived communicators are negative as int32, and the ABI reserves -1 for
        # MPI_COMM_WORLD. The core converts back with a cast to MPI_Fint.
        comm_f2c = comm.py2f() & 0xFFFFFFFF
    elif isinstance(comm, (list, tuple, range)):
        comm_f2c = -1
        check_ranks = sorted(int(r) for r in comm) or None
    else:
        raise ValueError("comm must be None, an mpi4py communicator or a list of ranks, "
                         "got %r" % (comm,))

    if not _lib.perseus_is_initialized():
        _lib.check(_lib.perseus_init(comm_f2c))
        _exit_report.install()
        _builder.reset()
        _requests.reset()
        _process_sets._on_init(comm if hasattr(comm, "py2f") else None, _objects.allgather_object)
        error = _launch_check.launched_alone_error(_mpi_world_size(comm))
        if error is not None:  # torchrun and the like: each process alone in MPI's world
            shutdown()
            raise error
        if check_ranks is not None and check_ranks != list(range(size())):
            shutdown()
            raise ValueError(
                "init(comm=<list of ranks>) supports only the list of all ranks; to run "
                "on a subset, pass an mpi4py communicator (e.g. MPI.COMM_WORLD.Split(...)), "
                "or register a ProcessSet after init()")
    _process_sets.add_process_sets(process_sets or (), size())


def _mpi_world_size(comm):
    """MPI_COMM_WORLD's size: the core's world, unless init() was given a communicator."""
    if hasattr(comm, "py2f"):
        from mpi4py import MPI  # comm is one of mpi4py's
        return MPI.COMM_WORLD.Get_size()
    return size()


def shutdown():
    """Stops the engine: pending requests complete or fail with an error. No-op
    when not initialized; init() may be called again afterwards."""
    if not _lib.perseus_is_initialized():
        return
    try:
        _lib.check(_lib.perseus_shutdown())
    finally:
        _process_sets._on_shutdown()


def is_initialized():
    return bool(_lib.perseus_is_initialized())


def world_failed():
    """Whether a rank of the running world failed (a fault-tolerant job: see
    fault_tolerance()); shutdown() and init() then go on with the survivors."""
    return bool(_lib.perseus_world_failed())


def joined_job():
    """Whether this process was started by a running job that grew in place (Open MPI
    5's MPI_Comm_spawn) and its init() joined that job."""
    return bool(_lib.perseus_joined_job())


def fault_tolerance(built=False):
    """(enabled, why): whether this job outlives a failed rank, shrinking its world to
    the survivors (the core's MPI has ULFM and mpirun started the job with it), and
    why or why not (never under srun: launch_check.started_by_srun()). built=True:
    whether the core's MPI has ULFM at all (perseusrun --elastic asks, before starting
    a job with it)."""
    built_in, enabled = ctypes.c_int32(), ctypes.c_int32()
    why = _lib.perseus_fault_tolerance(ctypes.byref(built_in), ctypes.byref(enabled))
    if built:
        return bool(built_in.value), why.decode()
    if built_in.value and _launch_check.started_by_srun():
        # ULFM may be on (OMPI_MCA_mpi_ft_enable), but Slurm ends the step at the first
        # failure, so say so rather than promise a shrink that never comes.
        return False, "its MPI has ULFM, but " + _launch_check.SRUN_ENDS_THE_STEP
    return bool(enabled.value), why.decode()


def _query(fn):
    out = ctypes.c_int32()
    _lib.check(fn(ctypes.byref(out)))
    return out.value


def size():
    """Number of processes."""
    return _query(_lib.perseus_size)


def rank():
    """This process's rank, 0 .. size()-1."""
    return _query(_lib.perseus_rank)


def local_size():
    """Number of processes on this node."""
    return _query(_lib.perseus_local_size)


def local_rank():
    """This process's rank among the processes on its node."""
    return _query(_lib.perseus_local_rank)


def cross_size():
    """Number of ranks with this local rank, one per node (the number of nodes where
    every node holds as many ranks)."""
    return _query(_lib.perseus_cross_size)


def cross_rank():
    """This rank's rank among the ranks with its local rank, one per node (Horovod's
    cross rank: the node's number only where every node holds as many ranks)."""
    return _query(_lib.perseus_cross_rank)


def rank_nodes():
    """Each rank's node, by rank: the nodes numbered from 0 by their lowest rank (the
    core found them at init; no communication here)."""
    nodes = (ctypes.c_int32 * size())()
    _lib.check(_lib.perseus_rank_nodes(nodes, len(nodes)))
    return list(nodes)


def is_homogeneous():
    """Whether every node holds as many ranks; the same answer on every rank."""
    return bool(_query(_lib.perseus_is_homogeneous))


def mpi_threads_supported():
    """Whether MPI provides MPI_THREAD_MULTIPLE."""
    return bool(_query(_lib.perseus_mpi_threads_supported))


def lane_count():
    """Number of lanes (concurrent execution streams) the engine actually uses."""
    return _query(_lib.perseus_lane_count)


def meeting_seconds():
    """How long a collective control call (add_process_set, new_group) waits for
    every rank before it fails naming the absent ones: PERSEUS_STALL_CHECK_TIME_SECONDS,
    or 60 s where that check is off."""
    out = ctypes.c_double()
    _lib.check(_lib.perseus_meeting_seconds(ctypes.byref(out)))
    return out.value


def config():
    """The validated configuration as {NAME: value string}; before init() it is
    what the environment would give."""
    text = (_lib.perseus_config_string() or b"").decode("utf-8", "replace")
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {name: value for name, value in pairs}


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome-trace timeline (chrome://tracing, Perfetto) to
    file_path, as PERSEUS_TIMELINE / HOROVOD_TIMELINE does from init().

    Collective, like add_process_set: call it on every rank. Rank 0 opens and writes
    the file (the other ranks' file_path is not used), and every rank returns rank 0's
    outcome: a ValueError on every rank when rank 0 cannot open or write the file. A
    rank that does not call it within PERSEUS_STALL_CHECK_TIME_SECONDS fails the
    others' call with HorovodInternalError naming it. A running timeline is closed
    first. mark_cycles adds an instant event per negotiation round. A write error
    later on stops the timeline with one warning. `python -m perseus.timeline_summary
    FILE` prints totals.
    """
    _lib.check(_lib.perseus_start_timeline(os.fsencode(file_path), 1 if mark_cycles else 0))


def stop_timeline():
    """Closes the timeline file (shutdown() does it too). Not collective: a no-op on
    ranks other than 0, and when no timeline runs."""
    _lib.check(_lib.perseus_stop_timeline())


# What this build provides. Perseus always runs on MPI; CUDA and NCCL are loaded at
# run time, so their answers come from trying to load them (perseus.common.gpu).
def mpi_enabled():
    return True


def mpi_built(verbose=False):
    return True


def gloo_enabled():
    return False


def gloo_built(verbose=False):
    return False


def nccl_built(verbose=False):
    """NCCL's version code when NCCL and the CUDA runtime load in this process, else 0."""
    from perseus.common import gpu  # on first use: loading the GPU libraries is not init's business
    return gpu.nccl_built(verbose)


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def cuda_built(verbose=False):
    """True when the CUDA runtime loads in this process."""
    from perseus.common import gpu
    return gpu.cuda_built(verbose)


def rocm_built(verbose=False):
    return False


def _shutdown_at_exit():
    if _lib.perseus_is_initialized():
        _exit_report.at_exit()  # bounded, never raises
        _process_sets._on_shutdown()


atexit.register(_shutdown_at_exit)
