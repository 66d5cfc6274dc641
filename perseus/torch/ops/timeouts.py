"""Time limits of torch's collectives, for both faces (the drop-in and the c10d
backend): how often a rank answers its peers within a timeout, and monitored_barrier,
a barrier that names the ranks that did not reach it in time.

A time limit is a `bound`, (seconds, reason): a Work given a deadline (bounded())
withdraws its request at the deadline unless every rank has submitted it, and the
engine's error then names the ranks that had not, ending with `reason`.
"""

import datetime
import re
import time
import warnings

import torch.distributed as _torch_dist

from perseus.common import requests as _requests

# How often within a timeout a rank looks for its peers' messages, idle or not: a rank
# whose collective times out learns who lacks it from a round they join. And at least
# this often (seconds), for the shorter timeouts of monitored_barrier().
_PROBES_PER_TIMEOUT = 8
_PROBE_AT_LEAST_S = 0.5

# How the engine's error for a withdrawn request names the global ranks that had not
# submitted it (perseus_withdraw, csrc/src/c_api.cc).
_NOT_SUBMITTED = re.compile(r"rank\(s\) \[([0-9, ]*)\] had not submitted it")


def answer_within(process_set, timeout_s):
    """Has this rank answer the set's peers often enough for a timeout of `timeout_s`
    (None: no timeout; the engine's default, up to 5 s, is then shortened to the
    floor). Only ever shortens the set's interval."""
    probe_s = _PROBE_AT_LEAST_S
    if timeout_s:
        probe_s = min(probe_s, timeout_s / _PROBES_PER_TIMEOUT)
    _requests.probe_within(process_set.process_set_id, probe_s)


def group_bound(timeout):
    """A process group's `timeout` (a timedelta; None or zero: none) as the bound of each
    of its calls, or None. torch's type check: anything else is a TypeError."""
    if timeout is None:
        return None
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError("Expected timeout argument to be of type datetime.timedelta, got %s"
                        % (timeout,))
    seconds = timeout.total_seconds()
    if not seconds:
        return None
    return seconds, "within the process group's timeout of %g s" % seconds


def deadline(bound):
    """`bound` ((seconds, reason) or None) from now: (deadline, reason) as a call run to
    completion at once takes it (perseus.common.requests.run), or None."""
    return None if bound is None else (time.monotonic() + bound[0], bound[1])


def bounded(work, bound):
    """`work`, withdrawn at `bound`'s end ((seconds, reason) from now; None: never)
    unless every rank submitted it by then."""
    if bound is not None:
        work._deadline, work._deadline_reason = deadline(bound)
    return work


def monitored_seconds(timeout):
    """monitored_barrier's `timeout` in seconds, as torch takes it: a timedelta, a
    float of seconds (with torch's warning), or None (torch's default group timeout)."""
    if isinstance(timeout, float):
        warnings.warn("Please specify timeout arg as a timedelta. Converting current value "
                      "of %s assuming it represents seconds" % timeout, stacklevel=3)
        timeout = datetime.timedelta(seconds=timeout)
    if timeout is None:
        timeout = _torch_dist.constants.default_pg_timeout
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError("Expected timeout argument to be of type datetime.timedelta, got %s"
                        % (timeout,))
    return timeout.total_seconds()


def monitored_bound(seconds):
    return seconds, "within monitored_barrier's timeout of %g s" % seconds


def _missing_ranks(error):
    """The global ranks a withdrawn request's error names, or None for another error."""
    found = _NOT_SUBMITTED.search(str(error))
    ranks = [int(r) for r in found.group(1).split(",") if r.strip()] if found else []
    return ranks or None


def wait_monitored(work, process_set, seconds, wait_all_ranks):
    """Waits for a barrier's `work` bounded by monitored_bound(seconds): gloo's monitored
    barrier. When ranks of the set had not reached it in time, rank 0 of the set raises
    naming the first of them (every one: wait_all_ranks), in group ranks, and the other
    ranks say that they reached it; gloo's words, then the engine's error, which names
    the missing global ranks. Other errors (a mismatch, a peer that shut down) as they
    are. The ranks that never came leave the group's calls out of step, as a timed-out
    collective does (gloo's group breaks too)."""
    try:
        work.wait()
    except RuntimeError as error:
        missing = _missing_ranks(error)
        if missing is None:
            raise
        ms = int(seconds * 1000)
        rank = process_set.rank()
        if rank == 0:
            group_ranks = [process_set.ranks.index(r) for r in missing]
            if not wait_all_ranks:
                said = "Rank %d failed" % group_ranks[0]
            else:  # "Ranks" even for one, as gloo says
                said = "Ranks %s failed" % ", ".join(str(r) for r in group_ranks)
            message = ("[Rank 0]: %s to pass monitoredBarrier in %d ms\n Original "
                       "exception: \nRank 0 timed out in monitoredBarrier after %d ms: %s"
                       % (said, ms, ms, error))
        else:
            message = ("Rank %d successfully reached monitoredBarrier, but received errors "
                       "while waiting for send/recv from rank 0. Please check rank 0 logs "
                       "for faulty rank.\n Original exception: \n%s" % (rank, error))
        raise type(error)(message) from None
