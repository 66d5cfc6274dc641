"""Multi-host runs on one machine (issue 39): two hosts of two ranks each, made of
Linux namespaces by tests/support/fake_hosts.py (own network on a veth bridge, hostname,
/etc/hosts, /dev/shm and IPC), started the way a user starts a job on a cluster:
logged in on hostA, `perseusrun -H hostA:2,hostB:2 python ...`, with MPI's
launcher reaching hostB through the agent that plays ssh.

The hosts are made once per session (conftest's `hosts` fixture). Not root: the tests
skip, saying why (under CI=true they fail). Root without `ip`, `unshare` or `nsenter`:
they fail, since scripts/setup.sh --all installs them.
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import fake_hosts
from support.jobs import RANK_SCRIPTS, REPO_ROOT, kill_job, run_bounded
from test_open_mpi import open_mpi  # noqa: F401 - a fixture: the core built with Open MPI

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(400)]

HOSTS = ["hostA", "hostB"]
VENV_BIN = Path(sys.executable).parent


def user_env(hosts, scratch, extra=None):
    """What the user's shell on hostA holds: the venv on PATH (as after `activate`),
    this checkout on PYTHONPATH, the agent as MPI's launcher, one thread per rank."""
    env = dict(hosts.agent_env(), PATH="%s:%s" % (VENV_BIN, fake_hosts.LOGIN_PATH),
               PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1", PTEST_TMPDIR=str(scratch))
    env.update(extra or {})
    return env


def perseusrun_on_hosts(hosts, scratch, script_argv, extra_env=None, timeout=300,
                        perseusrun_args=()):
    """`perseusrun -H hostA:2,hostB:2 [-x PTEST_...] python SCRIPT...` typed on
    hostA -> (returncode, stdout, stderr, seconds). The test scripts' own PTEST_*
    variables are named with -x, which Open MPI needs (MPICH forwards everything)."""
    env = user_env(hosts, scratch, dict(extra_env or {}, PTEST_HANG_DUMP_S=str(timeout - 15)))
    forward = [arg for name in sorted(env) if name.startswith("PTEST_") for arg in ("-x", name)]
    argv = (["perseusrun", "-H", "hostA:2,hostB:2"] + list(perseusrun_args)
            + forward + ["python"] + [str(a) for a in script_argv])
    return run_bounded(hosts.command("hostA", argv, env, cwd=REPO_ROOT), os.environ, timeout)


def digests(text):
    found = {}
    for rank, part, value in re.findall(r"DIGEST (\d+) (\w+) ([0-9a-f]{64})", text):
        found[(int(rank), part)] = value
    return found


def ucx_lanes(text):
    """{'inter-node': {'tcp/eth0'}, 'intra-node': {...}, ...}: the transports in UCX's
    protocol tables (UCX_PROTO_INFO=y), by the kind of peer each table is for. Each
    line starts with [host:pid:thread], the pid padded to a width ([hostB:6326 :0]); the
    processes' lines may interleave."""
    lanes, kind = {}, {}
    for line in text.splitlines():
        who = re.search(r"\[(\w+:\d+) *:\d+\]", line)
        if who is None:
            continue
        header = re.search(r"\| ucp_context_\d+ ([\w-]+) cfg#\d+ \|", line)
        if header:
            kind[who.group(1)] = header.group(1)
            continue
        cells = [cell.strip() for cell in line.split("|")]
        if who.group(1) in kind and len(cells) >= 4 and re.fullmatch(r"\w+/[\w.:-]+", cells[-2]):
            lanes.setdefault(kind[who.group(1)], set()).add(cells[-2])
    return lanes


def four_ranks_on_two_hosts(rc, out, err, seconds):
    """Checks that the job of tests/rank_scripts/multi_host.py passed on its 4 ranks, 0-1 on hostA
    and 2-3 on hostB (where the agent started them); returns the run's report."""
    report = "rc %d after %.1f s\n----- stdout -----\n%s\n----- stderr -----\n%s" % (
        rc, seconds, out, err[-20000:])
    assert rc == 0, report
    assert out.count(" ok") == 4, report
    assert sorted(re.findall(r"HOST (\d) (\w+)", out)) == [
        ("0", "hostA"), ("1", "hostA"), ("2", "hostB"), ("3", "hostB")], report
    return report


def test_two_hosts_match_one_host(hosts, run_mpi, tmp_path):
    """tests/rank_scripts/multi_host.py on 4 ranks of one host, then on hostA and hostB through
    perseusrun and MPICH's Hydra: the same bits, the hosts' topology, TCP between them."""
    one_host = digests(run_mpi("multi_host", 4, env={"PTEST_HOSTS": "1"}, timeout=240))
    rc, out, err, seconds = perseusrun_on_hosts(
        hosts, tmp_path, [RANK_SCRIPTS / "multi_host.py"],
        {"PTEST_HOSTS": "2", "UCX_PROTO_INFO": "y"})
    report = four_ranks_on_two_hosts(rc, out, err, seconds)

    # Bit-identical to one host, part by part and rank by rank.
    two_hosts = digests(out)
    assert len(one_host) == 16 and sorted(two_hosts) == sorted(one_host), report
    differ = sorted(key for key in one_host if one_host[key] != two_hosts[key])
    assert not differ, "results differ from one host's in %s\n%s" % (differ, report)

    # Traffic between the hosts went over TCP on eth0: in UCX's own tables of the
    # protocols it chose, every inter-node lane is tcp/eth0 (the ranks of one host
    # use its shared memory) ...
    lanes = ucx_lanes(out + err)
    assert lanes.get("inter-node") == {"tcp/eth0"}, (lanes, report)
    # ... and each host's eth0 counters, read by its local rank 0 around one allreduce.
    traffic = {(host, mode): int(sent) for host, mode, sent in
               re.findall(r"TRAFFIC (\w+) (\w+) (\d+)", out)}
    assert len(traffic) == 4, report
    payload = 4 << 21  # the measured allreduce: 8 MiB of float32
    for host in HOSTS:
        # One large allreduce: flat, each of the host's two ranks exchanges its data
        # with its peer on the other host (about 2 x 8 MiB sent); hierarchical, only
        # each local rank's half, reduced on the host first, crosses (about 8 MiB).
        flat, hierarchical = traffic[host, "flat"], traffic[host, "hierarchical"]
        assert payload <= hierarchical < 0.7 * flat, (traffic, report)


def bml_choices(text):
    """{(from host, to host): {btl, ...}} from Open MPI's `mca: bml: Using <btl> btl for
    send to [[job,1],<rank>] on node <host>` lines (btl_base_verbose)."""
    found = {}
    for host, btl, to in re.findall(r"\[(\w+):\d+\] mca: bml: Using (\w+) btl for send to "
                                     r"\[\[\d+,\d+\],\d+\] on node (\w+)", text):
        found.setdefault((host, to), set()).add(btl)
    return found


def test_two_hosts_open_mpi(hosts, open_mpi, tmp_path):  # noqa: F811 - the fixture
    """Debian's Open MPI: its mpirun starts orted on hostB through the agent
    (plm_rsh_agent); perseusrun forwards the variables the ranks need (-x)."""
    rc, out, err, seconds = perseusrun_on_hosts(
        hosts, tmp_path, [RANK_SCRIPTS / "multi_host.py"],
        {"PTEST_HOSTS": "2", "PTEST_PARTS": "collectives",
         "PYTHONPATH": open_mpi["pythonpath"], "OMPI_MCA_btl_base_verbose": "30"},
        perseusrun_args=["--mpirun", open_mpi["mpirun"]])
    report = four_ranks_on_two_hosts(rc, out, err, seconds)
    # Open MPI's own verbose output: the ranks of the other host are reached through TCP.
    choices = bml_choices(out + err)
    assert choices.get(("hostA", "hostB")) == {"tcp"} == choices.get(("hostB", "hostA")), (
        choices, report)
    traffic = dict(((h, m), int(b)) for h, m, b in re.findall(r"TRAFFIC (\w+) (\w+) (\d+)", out))
    assert all(traffic[h, "flat"] >= 4 << 21 for h in HOSTS), (traffic, report)


# ---------------------------------------------------------------- network faults

FAULT_WAIT_S = 60  # how long the job's ranks run on without an error before giving up


def run_with_fault(hosts, scratch, fault, env, bound_s):
    """Runs tests/rank_scripts/host_faults.py on the hosts, applies `fault` to hostB once every
    rank is in its allreduce loop, and waits at most bound_s + 30 s for the job to end
    (then it is killed and the test fails). -> {"rc", "ended" (s after the fault),
    "errors": {rank: (s after the fault, host, line)}, "output", "left" (hostB's
    processes of the job still there 6 s after the end)}."""
    env = user_env(hosts, scratch, dict(env, PTEST_FAULT_WAIT_S=str(FAULT_WAIT_S),
                                        PTEST_HANG_DUMP_S=str(FAULT_WAIT_S + 30)))
    argv = ["perseusrun", "-H", "hostA:2,hostB:2", "python",
            str(RANK_SCRIPTS / "host_faults.py")]
    log = open(scratch / "job.log", "w+")
    proc = subprocess.Popen(hosts.command("hostA", argv, env, cwd=REPO_ROOT), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (scratch / "running").exists():
            assert proc.poll() is None and time.monotonic() < deadline, \
                "the job never started its loop:\n" + log_text(log)
            time.sleep(0.05)
        faulted = time.time()
        fault()
        try:
            rc = proc.wait(timeout=bound_s + 30)
        except subprocess.TimeoutExpired:
            alive = kill_job(proc, stacks=True)
            pytest.fail("the job did not end within %d s of the fault; still alive:\n%s\n%s"
                        % (bound_s + 30, alive, log_text(log)), pytrace=False)
        ended = time.time() - faulted
        left = hosts.pids_on("hostB", "host_faults.py")
        give_up = time.monotonic() + 6  # a cut-off host's ranks leave 5 s after they abort
        while left and time.monotonic() < give_up:
            time.sleep(0.2)
            left = hosts.pids_on("hostB", "host_faults.py")
    finally:
        if proc.poll() is None:
            kill_job(proc)
        hosts.link("hostB", True)
    errors = {}
    for path in scratch.glob("error.*"):
        at, line = path.read_text().split("\n", 1)
        host, line = line.strip().split(" ", 1)
        errors[int(path.name.split(".")[1])] = (float(at) - faulted, host, line)
    return {"rc": rc, "ended": ended, "errors": errors, "output": log_text(log), "left": left}


def log_text(log):
    log.flush()
    log.seek(0)
    return log.read()[-20000:]


def kill_host_ranks(hosts, sig):
    def fault():
        ranks = [pid for pid in hosts.pids_on("hostB", "host_faults.py")
                 if open("/proc/%d/cmdline" % pid, "rb").read().startswith(b"python")]
        assert len(ranks) == 2, ranks
        for pid in ranks:
            os.kill(pid, sig)
    return fault


def report_of(result):
    print("job ended %.1f s after the fault; errors at %s s" % (result["ended"], ", ".join(
        "%.1f" % e[0] for _, e in sorted(result["errors"].items()))))
    return "rc %s, job ended %.1f s after the fault, errors (s after the fault):\n%s\n%s" % (
        result["rc"], result["ended"],
        "\n".join("  rank %d: %.1f s on %s: %s" % (r, *e) for r, e in sorted(result["errors"].items())),
        result["output"])


def test_link_down_fails_every_rank_and_ends_the_job(hosts, tmp_path):
    """hostB's eth0 goes down for good mid-allreduce: every rank on both sides raises
    at the peer timeout naming the other host's ranks, mpirun exits, and hostB's ranks
    leave too (MPI_Abort, then their own exit)."""
    timeout_s = 6
    result = run_with_fault(hosts, tmp_path, lambda: hosts.link("hostB", False),
                            {"PERSEUS_PEER_TIMEOUT_SECONDS": str(timeout_s)}, timeout_s)
    report = report_of(result)
    assert sorted(result["errors"]) == [0, 1, 2, 3], report
    for rank, (after, host, line) in result["errors"].items():
        unreachable = "[2, 3]" if rank < 2 else "[0, 1]"
        assert after <= timeout_s + 5, report
        assert host == ("hostA" if rank < 2 else "hostB"), report
        assert ("HorovodInternalError: Perseus stopped process set 0 at the peer timeout "
                "(PERSEUS_PEER_TIMEOUT_SECONDS): rank(s) %s not responding" % unreachable) in line, report
    assert result["rc"] != 0 and result["ended"] <= timeout_s + 10, report
    assert "NO ERROR" not in result["output"] and not result["left"], report


def test_host_killed_ends_the_job(hosts, tmp_path):
    """Every rank of hostB killed (SIGKILL): MPICH's mpirun ends the job, as on one host."""
    result = run_with_fault(hosts, tmp_path, kill_host_ranks(hosts, signal.SIGKILL), {}, 30)
    report = report_of(result)
    assert result["rc"] != 0 and result["ended"] < 30, report
    assert "RUNNING AT hostB" in result["output"] and "NO ERROR" not in result["output"], report


def test_host_frozen_is_named_and_ends_the_job(hosts, tmp_path):
    """Every rank of hostB stopped (SIGSTOP): hostA's ranks name them at the stall check
    time and raise at the stall shutdown time; the job ends, the stopped ranks too."""
    check_s, shutdown_s = 3, 6
    result = run_with_fault(hosts, tmp_path, kill_host_ranks(hosts, signal.SIGSTOP),
                            {"PERSEUS_STALL_CHECK_TIME_SECONDS": str(check_s),
                             "PERSEUS_STALL_SHUTDOWN_TIME_SECONDS": str(shutdown_s)}, shutdown_s)
    report = report_of(result)
    assert sorted(result["errors"]) == [0, 1], report
    for after, host, line in result["errors"].values():
        assert after <= shutdown_s + 5 and host == "hostA", report
        assert ("at the stall shutdown time (PERSEUS_STALL_SHUTDOWN_TIME_SECONDS): rank(s) [2, 3] "
                "not responding") in line, report
    warnings = re.findall(r"WARNING rank ([01])\] stall in process set 0: rank\(s\) \[2, 3\] "
                          r"not responding", result["output"])
    assert sorted(set(warnings)) == ["0", "1"], report
    assert result["rc"] != 0 and result["ended"] <= shutdown_s + 10 and not result["left"], report


def test_delay_and_loss_give_the_same_results(hosts, run_mpi, tmp_path):
    """20 ms delay and 1 % loss on both hosts' links (netem): the collectives give the
    bits of one host. Skipped where the kernel has no netem."""
    added = []
    try:
        for host in HOSTS:
            res = hosts.tc(host, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "20ms",
                           "loss", "1%")
            if res.returncode != 0:
                pytest.skip("netem is not available here (tc qdisc add ... netem: %s)"
                            % res.stderr.strip())
            added.append(host)
        one_host = digests(run_mpi("multi_host", 4, env={"PTEST_HOSTS": "1",
                                                         "PTEST_PARTS": "collectives"}))
        rc, out, err, seconds = perseusrun_on_hosts(
            hosts, tmp_path, [RANK_SCRIPTS / "multi_host.py"],
            {"PTEST_HOSTS": "2", "PTEST_PARTS": "collectives"})
        assert rc == 0, out + err
        assert digests(out) == one_host, out
    finally:
        for host in added:
            hosts.tc(host, "qdisc", "del", "dev", "eth0", "root")
