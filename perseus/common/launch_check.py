"""Refuses a process that a non-MPI launcher started as one of several, but that MPI
sees as a world of one: each such process would train alone as rank 0.

Perseus takes its ranks from MPI. What each launcher leaves to find this out:

  * torchrun and `python -m torch.distributed.launch` set WORLD_SIZE (with RANK,
    LOCAL_RANK, LOCAL_WORLD_SIZE) in every process they start: checked here. A
    multi-node torchrun's WORLD_SIZE counts every node's processes.
  * MPI launchers of another MPI (OMPI_COMM_WORLD_SIZE, PMIX_SIZE, PMI_SIZE,
    MV2_COMM_WORLD_SIZE) and srun without a PMI the MPI can use (SLURM_STEP_NUM_TASKS
    with SLURM_PROCID): checked by the core itself at MPI's start
    (csrc/src/mpi/launcher_world.cc), with a fix for each; SLURM_NTASKS alone is no
    sign, as an sbatch script's own shell has it.
  * multiprocessing (torch.multiprocessing.spawn, mp.Process) sets nothing a child
    could tell from a process started alone on purpose: not detectable. Such a script
    passes its rank and world size to torch itself; under Perseus start it with
    mpirun instead.

A plain `python` process and a real `mpirun -np 1` set no WORLD_SIZE, so they run.

started_by_srun() tells a task of an srun step (rather than an mpirun's rank inside
the allocation): there a ULFM core cannot shrink, since Slurm's PMIx plugin kills the
step at the first failure, and basics.fault_tolerance() says so.
"""

import os

from perseus.common.exceptions import HorovodInternalError

# What a running job's process manager (Hydra, Open MPI/PMIx) sets in its ranks: a job
# started from inside one drops these (perseusrun), or it would join the outer job; a
# rank spawned on another host is not given them (perseus/common/elastic.py).
LAUNCHER_STATE_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCAL", "OMPI_")


def _count(text):
    """A positive count, or 0 when unset or not a number."""
    try:
        value = int(text or 0)
    except ValueError:
        return 0
    return max(value, 0)


def launched_alone_error(mpi_world_size, environ=None):
    """The error for this process, or None: MPI's world has 1 rank while WORLD_SIZE
    says the launcher started more."""
    env = os.environ if environ is None else environ
    launched = _count(env.get("WORLD_SIZE"))
    if mpi_world_size != 1 or launched <= 1:
        return None
    rank = env.get("RANK")
    return HorovodInternalError(
        "init(): WORLD_SIZE=%d%s says a launcher (torchrun or python -m "
        "torch.distributed.launch?) started %d processes, but MPI says the world has 1 "
        "rank, so each would train alone as rank 0 of 1. Perseus takes its ranks from "
        "MPI, not from torch's launcher variables: launch with mpirun -np %d (or "
        "perseusrun -np %d)" % (launched, ", RANK=%s" % rank if rank is not None else "",
                                launched, launched, launched))


def check_launched_world(mpi_world_size, environ=None):
    """Raises launched_alone_error() when there is one (HorovodInternalError, a
    RuntimeError, as the core's own launcher check)."""
    error = launched_alone_error(mpi_world_size, environ)
    if error is not None:
        raise error


# Variables that an MPI launcher sets in the processes it starts itself (Open MPI's
# prterun, Hydra, MVAPICH): with one of them, srun's variables are an outer step's.
_MPI_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PRTE_LAUNCHED", "PMI_SIZE",
                           "MV2_COMM_WORLD_SIZE")

SRUN_ENDS_THE_STEP = (
    "srun started this job, and Slurm's PMIx plugin (srun --mpi=pmix) kills the whole "
    "job step when a task ends without MPI_Finalize, and again when Open MPI reports a "
    "failed rank to it, so no rank survives a failure (docs/elastic.md, Slurm). Start the "
    "ranks with perseusrun --elastic -np N inside the allocation (sbatch or salloc) "
    "instead: its mpirun --with-ft ulfm keeps the ranks' failures from Slurm")


def started_by_srun(environ=None):
    """Whether srun itself started this process as a task of a step of several (not
    an mpirun inside an allocation or inside a step)."""
    env = os.environ if environ is None else environ
    if _count(env.get("SLURM_STEP_NUM_TASKS")) <= 1 or "SLURM_PROCID" not in env:
        return False
    return not any(name in env for name in _MPI_LAUNCHER_VARIABLES)
