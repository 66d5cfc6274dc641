"""PERSEUS_AUTOTUNE under mpirun (tests/rank_scripts/autotune.py): the ranks reach one
decision together, results stay right during and after tuning, and training under
autotune equals single-process training. Short samples keep the jobs quick."""

import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]

QUICK = {"PERSEUS_AUTOTUNE_WARMUP_SAMPLES": "1", "PERSEUS_AUTOTUNE_STEPS_PER_SAMPLE": "2",
         "PERSEUS_LOG_LEVEL": "info"}


CASES = {
    "np2": (2, {"PERSEUS_AUTOTUNE": "1"}),
    "np4-horovod-names": (4, {"HOROVOD_AUTOTUNE": "1"}),           # Horovod's spelling
    "np4-fixed-fusion-lanes": (4, {"PERSEUS_AUTOTUNE": "1", "PERSEUS_FUSION_THRESHOLD": "1048576",
                                   "PERSEUS_ALLREDUCE_STREAMS": "2"}),  # fixed knobs stay fixed
    "np4-streams-auto": (4, {"PERSEUS_ALLREDUCE_STREAMS": "auto"}),     # lanes only
}


@pytest.mark.parametrize("setting", list(CASES))
def test_autotune(run_mpi_batch, tmp_path_factory, setting):
    # The cases of one np in one job, each a fresh init() that starts its own autotuner
    # (run_mpi_batch's settings); each logs to a file of its own.
    nprocs = CASES[setting][0]
    folder = tmp_path_factory.getbasetemp()
    settings = {}
    for name, (np, env) in CASES.items():
        if np == nprocs:
            env = dict(QUICK, **env)
            log = "HOROVOD_AUTOTUNE_LOG" if "HOROVOD_AUTOTUNE" in env else "PERSEUS_AUTOTUNE_LOG"
            env[log] = str(folder / ("autotune-%s.csv" % name))
            settings[name] = env
    run_mpi_batch("autotune", nprocs, ["autotune"], settings=settings, setting=setting, timeout=360)


SETTINGS_CASES = [
    ({}, "SETTINGS 0 1 10"),
    ({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "3"}, "SETTINGS 1 1 3"),
    ({"PERSEUS_ALLREDUCE_STREAMS": "AUTO"}, "SETTINGS 0 auto 10"),
    ({"PERSEUS_ALLREDUCE_STREAMS": "many"}, "PERSEUS_ALLREDUCE_STREAMS='many' is invalid"),
    ({"PERSEUS_AUTOTUNE": "maybe"}, "PERSEUS_AUTOTUNE='maybe' is invalid"),
    ({"HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "-1"}, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES='-1' is invalid"),
]


@pytest.fixture(scope="module")
def settings_outputs(settings_at_init):
    return settings_at_init([env for env, _ in SETTINGS_CASES], ("PERSEUS_AUTOTUNE", "PERSEUS_ALLREDUCE_STREAMS", "PERSEUS_AUTOTUNE_STEPS_PER_SAMPLE"))


@pytest.mark.parametrize("case", range(len(SETTINGS_CASES)), ids=[e for _, e in SETTINGS_CASES])
def test_settings(settings_outputs, case):
    output, expect = settings_outputs[case], SETTINGS_CASES[case][1]
    assert expect in output, output
