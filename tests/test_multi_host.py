"""Multi-host runs on one machine (issue 39): two hosts of two ranks each, made of
Linux namespaces by tests/fake_hosts.py (own network on a veth bridge, hostname,
/etc/hosts, /dev/shm and IPC), started the way a user starts a job on a cluster:
logged in on hostA, `perseusrun -np 4 -H hostA:2,hostB:2 python ...`, with MPI's
launcher reaching hostB through the agent that plays ssh.

The hosts are made once per session (conftest's `hosts` fixture). Not root: the tests
skip, saying why (under CI=true they fail). Root without `ip`, `unshare` or `nsenter`:
they fail, since scripts/setup.sh --all installs them.
"""
import os
import re
import sys
from pathlib import Path

import pytest

import fake_hosts
from conftest import MPI_SCRIPTS, REPO_ROOT, run_bounded
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
    """`perseusrun -np 4 -H hostA:2,hostB:2 [-x PTEST_...] python SCRIPT...` typed on
    hostA -> (returncode, stdout, stderr, seconds). The test scripts' own PTEST_*
    variables are named with -x, which Open MPI needs (MPICH forwards everything)."""
    env = user_env(hosts, scratch, dict(extra_env or {}, PTEST_HANG_DUMP_S=str(timeout - 15)))
    forward = [arg for name in sorted(env) if name.startswith("PTEST_") for arg in ("-x", name)]
    argv = (["perseusrun", "-np", "4", "-H", "hostA:2,hostB:2"] + list(perseusrun_args)
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
    line starts with [host:pid:thread]; the processes' lines may interleave."""
    lanes, kind = {}, {}
    for line in text.splitlines():
        who = re.search(r"\[(\w+:\d+):\d+\]", line)
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


def test_two_hosts_match_one_host(hosts, run_mpi, tmp_path):
    one_host = digests(run_mpi("multi_host", 4, env={"PTEST_HOSTS": "1"}, timeout=240))
    rc, out, err, seconds = perseusrun_on_hosts(
        hosts, tmp_path, [MPI_SCRIPTS / "multi_host.py"],
        {"PTEST_HOSTS": "2", "UCX_PROTO_INFO": "y"})
    report = "rc %d after %.1f s\n----- stdout -----\n%s\n----- stderr -----\n%s" % (
        rc, seconds, out, err[-20000:])
    assert rc == 0, report
    assert out.count(" ok") == 4, report
    # Ranks 0-1 on hostA, 2-3 on hostB: the agent started them there.
    assert sorted(re.findall(r"HOST (\d) (\w+)", out)) == [
        ("0", "hostA"), ("1", "hostA"), ("2", "hostB"), ("3", "hostB")], report

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
        hosts, tmp_path, [MPI_SCRIPTS / "multi_host.py"],
        {"PTEST_HOSTS": "2", "PTEST_PARTS": "collectives process_sets",
         "PYTHONPATH": open_mpi["pythonpath"], "OMPI_MCA_btl_base_verbose": "30"},
        perseusrun_args=["--mpirun", open_mpi["mpirun"]])
    report = "rc %d after %.1f s\n----- stdout -----\n%s\n----- stderr -----\n%s" % (
        rc, seconds, out, err[-20000:])
    assert rc == 0, report
    assert out.count(" ok") == 4, report
    assert sorted(re.findall(r"HOST (\d) (\w+)", out)) == [
        ("0", "hostA"), ("1", "hostA"), ("2", "hostB"), ("3", "hostB")], report
    # Open MPI's own verbose output: the ranks of one host reach each other through
    # shared memory (vader), the other host's through TCP.
    choices = bml_choices(out + err)
    assert choices.get(("hostA", "hostB")) == {"tcp"} == choices.get(("hostB", "hostA")), (
        choices, report)
    traffic = dict(((h, m), int(b)) for h, m, b in re.findall(r"TRAFFIC (\w+) (\w+) (\d+)", out))
    assert all(traffic[h, "flat"] >= 4 << 21 for h in HOSTS), (traffic, report)
