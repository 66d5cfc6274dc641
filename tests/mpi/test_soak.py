"""Randomized soak (tests/rank_scripts/soak.py): a bounded run of thousands of random
collectives at np 2 and 4 under different lane counts, tiny fusion thresholds and a
small negotiation cache; every result exact and identical across ranks, memory flat."""
import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

# A bound in rounds, not seconds: every run checks the same requests whatever the
# machine's load, with 900 rounds past WARM_ROUNDS (300) for the memory check, where
# one tensor leaked in 16 rounds adds about 56 live tensors (the check allows 32). The
# seconds only cap a very slow run (the script still needs more than WARM_ROUNDS).
ROUNDS = "1200"
SECONDS = "60"

CASES = {
    "np2-lanes1-fusion64": (2, {"PERSEUS_ALLREDUCE_STREAMS": "1", "PERSEUS_FUSION_THRESHOLD": "64"}),
    "np2-lanes4-fusion128-cache16": (2, {"PERSEUS_ALLREDUCE_STREAMS": "4", "PERSEUS_FUSION_THRESHOLD": "128",
                                         "PERSEUS_CACHE_CAPACITY": "16"}),
    "np4-lanes3-fusion512": (4, {"PERSEUS_ALLREDUCE_STREAMS": "3", "HOROVOD_FUSION_THRESHOLD": "512"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_soak(run_mpi, case):
    nprocs, env = CASES[case]
    out = run_mpi("soak", nprocs, env=dict(env, PTEST_SOAK_ROUNDS=ROUNDS, PTEST_SOAK_SECONDS=SECONDS),
                  timeout=120)
    assert "digests of" in out, out
