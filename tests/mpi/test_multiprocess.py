"""Multi-process tests of the core's collectives and lifecycle: each script in SCRIPTS
(tests/rank_scripts/) runs on every rank under `mpirun -np 2` and `-np 4` (oversubscribed on
small machines) and checks its results against a reference computed independently on
each rank. See each script's docstring. The other scripts of tests/rank_scripts/ are run by the
test file of their subject (training API, DDP, failures, GPU, ...);
tests/meta/test_rank_scripts_covered.py fails if any script is run by none."""
import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

NPROCS = [2, 4]

SCRIPTS = [
    "allreduce",                # every op x dtype x shape; sync, async, in place; scaling
    "round_payload",            # a loop of one small allreduce, its data carried by the round
    "adasum",                   # op=Adasum against a numpy reference; fused, sets, errors
    "grouped_allreduce",        # grouped variants, many groups in flight
    "allgather",                # uneven first dims, bool; grouped variants
    "broadcast",                # every root, 0-d and empty; in place and async
    "alltoall",                 # even and explicit splits, received splits
    "reducescatter",            # Sum/Average, uneven first dims; grouped variants
    "barrier",                  # nobody leaves early, globally and per set
    "join",                     # joined ranks count as zeros; last rank to join
    "process_sets",             # every collective on sets; add/remove
    "process_set_concurrency",  # sets do not block each other
    "errors",                   # mismatches raise on every rank, naming the tensor
    "bad_input",                # non-contiguous tensors; local argument errors, nothing sent
    "duplicate_names",          # a name in flight submitted again -> ValueError
    "init_basic",               # errors before init, topology, shutdown/re-init
    "init_mpi4py",              # MPI initialised by mpi4py, init(comm=...)
    "config_per_rank",          # settings differing by rank fail init on every rank
    "init_serialized",          # no MPI_THREAD_MULTIPLE: one lane, still correct
    "late_peer",                # a peer later than the driving window: no hang
    "on_complete",              # completion callbacks: once, first failure, shutdown
    "wait_all",                 # perseus_wait_all, synchronize_all: values, first failure
    "horovod_modules",          # Horovod's submodule paths, _basics, gpu_available
    "process_sets_static",      # init(process_sets=...) all or nothing, ids in order; forged ids
    "torch_arguments",          # in-place ops and autograd; non-integer, non-tensor, non-text arguments
]


# Scripts that need a process of their own (they start MPI themselves, or test what
# comes before the first init()); the others run in one job per np (tests/support/rank_batch.py).
FRESH = {"init_basic", "init_mpi4py", "config_per_rank", "init_serialized", "process_sets_static"}
BATCH = [s for s in SCRIPTS if s not in FRESH]


@pytest.mark.parametrize("nprocs", NPROCS)
@pytest.mark.parametrize("script", SCRIPTS)
def test_script(run_mpi, run_mpi_batch, script, nprocs):
    if script in FRESH:
        run_mpi(script, nprocs)
    else:
        run_mpi_batch(script, nprocs, BATCH, timeout=200)


def test_adasum_non_power_of_two(run_mpi):
    # 3 ranks: rank 2 folds into rank 0 before the recursive doubling.
    run_mpi("adasum", 3)


def test_adasum_lanes_and_small_pieces(run_mpi):
    # Two lanes, fusion buffers of 1 KiB and 4 KiB MPI pieces: Adasum batches spread
    # over both communicators, the large tensor sent in several pieces.
    run_mpi("adasum", 4, env={"PERSEUS_ALLREDUCE_STREAMS": "2", "PERSEUS_FUSION_THRESHOLD": "1024",
                              "PERSEUS_CHUNK_SIZE": "4096"})


# Bit-identical results on every rank with NaN/Inf/-0.0 inputs
# (tests/rank_scripts/identical_results.py):
# 2 and 3 ranks (3 changes MPI's algorithms), then 3 lanes with 4 KiB MPI pieces.
# The two at np 3 in one job (run_mpi_batch's settings).
IDENTICAL_NP3 = {"np3": {}, "np3-lanes-chunks": {"PERSEUS_ALLREDUCE_STREAMS": "3", "PERSEUS_CHUNK_SIZE": "4096",
                                                 "PERSEUS_FUSION_THRESHOLD": "65536"}}


@pytest.mark.parametrize("setting", ["np2", "np3", "np3-lanes-chunks"])
def test_identical_results(run_mpi, run_mpi_batch, setting):
    if setting == "np2":
        run_mpi("identical_results", 2, timeout=240)
    else:
        run_mpi_batch("identical_results", 3, ["identical_results"], settings=IDENTICAL_NP3,
                      setting=setting, timeout=240)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_bad_handles(run_mpi, nprocs):
    # poll()/synchronize() of made-up, synchronized and pre-init handles: ValueError.
    run_mpi("bad_handles", nprocs, timeout=90)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_config_names(run_mpi, nprocs):
    # Misspelt variables warned about once on rank 0 ("did you mean"), Horovod's unused
    # ones not; a bad HOROVOD_TIMELINE reported under that name.
    run_mpi("config_names", nprocs, timeout=90)


HOLDS = {
    "bytes": {"PERSEUS_HOLD_BYTES": "65536"},
    "auto": {"PERSEUS_HOLD_BYTES": "auto", "PERSEUS_FUSION_THRESHOLD": "2097152"},
}


@pytest.mark.parametrize("nprocs", NPROCS)
@pytest.mark.parametrize("setting", list(HOLDS))
def test_what_ends_a_hold(run_mpi_batch, nprocs, setting):
    # A hold far longer than the script's bounds: only a waiter, a poll or enough
    # bytes may end it, and control operations never wait for it (tests/rank_scripts/hold.py).
    # Both settings in one job per np, init() again between them (run_mpi_batch's settings).
    run_mpi_batch("hold", nprocs, ["hold"], env={"PERSEUS_HOLD_TIME": "20000"},
                  settings=HOLDS, setting=setting)


# Engine settings under which the mixed load of stress.py must give the same, correct
# results: 1, 2 and 4 lanes, fusion off, tiny fusion buffers, the Horovod spelling of the
# threshold, an extra 5 ms batching window, and no holding of small requests.
KNOBS = {
    "defaults": {},
    "lanes1": {"PERSEUS_ALLREDUCE_STREAMS": "1"},
    "lanes2": {"PERSEUS_ALLREDUCE_STREAMS": "2"},
    "lanes4": {"PERSEUS_ALLREDUCE_STREAMS": "4"},
    "no_fusion": {"PERSEUS_FUSION_THRESHOLD": "0"},
    "tiny_fusion_lanes2": {"PERSEUS_FUSION_THRESHOLD": "1024", "PERSEUS_ALLREDUCE_STREAMS": "2"},
    "horovod_threshold": {"HOROVOD_FUSION_THRESHOLD": "4096"},
    "cycle_5ms": {"PERSEUS_CYCLE_TIME": "5"},
    "no_hold": {"PERSEUS_HOLD_BYTES": "0"},
}


@pytest.mark.parametrize("nprocs", NPROCS)
@pytest.mark.parametrize("setting", list(KNOBS))
@pytest.mark.timeout(600)
def test_engine_settings(run_mpi_batch, setting, nprocs):
    # Every setting in one job per np, each a fresh init() that reads it (run_mpi_batch's
    # settings): one mpirun and one torch import per rank instead of nine.
    run_mpi_batch("stress", nprocs, ["stress"], settings=KNOBS, setting=setting, timeout=300)
