"""perseusrun --elastic --host-discovery-script (issue 46, point 3): the discovery
script's output, its failures, the flags' checks, the plan (hosts and np) and Horovod's
blacklist cooldown, without mpirun; the notice the ranks watch at commit. The jobs that
grow and shrink are in tests/mpi/test_fault_tolerance.py."""
import gc
import os
import signal
import subprocess
import sys
import time

import pytest

from perseus import launcher_elastic as le
from support.jobs import clean_env
from perseus.common import elastic, elastic_in_place
from perseus.common.exceptions import HorovodInternalError
from perseus.launcher import main


def test_discovery_output_is_read_as_horovod_reads_it():
    text = "node1:4\n\nnode2\n  node3:2  \n"
    assert le.parse_discovered(text, 3) == [("node1", 4), ("node2", 3), ("node3", 2)]
    assert le.parse_discovered("", 1) == []  # no host yet: allowed, as in Horovod


@pytest.mark.parametrize("text,said", [
    ("node1:4\nwhat is this\n", "printed 'what is this' on line 2: expected host or host:slots"),
    ("node1:four\n", "printed 'node1:four' on line 1"),
    ("node1:0\n", "a host needs at least one slot"),
    ("node1:2\nnode2:2\nnode1:4\n", "named host node1 twice (line 3)"),
])
def test_discovery_garbage_and_duplicates_are_named(text, said):
    with pytest.raises(le.DiscoveryError, match=None) as e:
        le.parse_discovered(text, 1, "the script")
    assert said in str(e.value), str(e.value)


def test_a_failing_or_hanging_script_is_an_error():
    with pytest.raises(le.DiscoveryError) as e:
        le.discover("echo no hosts >&2; exit 3", 1)
    assert "failed with exit code 3: no hosts" in str(e.value), str(e.value)
    started = time.monotonic()
    with pytest.raises(le.DiscoveryError) as e:
        le.discover("sleep 30", 1, timeout=0.5)
    assert time.monotonic() - started < 10
    assert "did not finish within 0.5 s (PERSEUS_HOST_DISCOVERY_TIMEOUT)" in str(e.value)
    assert le.discover("echo localhost:2", 1) == [("localhost", 2)]


@pytest.mark.parametrize("argv,said", [
    (["--elastic", "--host-discovery-script", "echo a:4", "--min-np", "4", "--max-np", "2"],
     "--min-np 4 is above --max-np 2"),
    (["--elastic", "--host-discovery-script", "echo a:4", "-np", "3", "--max-np", "2"],
     "-np 3 is above --max-np 2"),
    (["--host-discovery-script", "echo a:4", "-np", "2"],
     "--host-discovery-script needs --elastic"),
    (["--min-np", "2", "-np", "2"], "--min-np needs --elastic"),
    (["--elastic", "--max-np", "2", "-np", "2"], "--max-np needs --host-discovery-script"),
    (["--elastic", "--min-np", "3", "-np", "2"], "--min-np 3 is above -np 2"),  # this machine
    (["--elastic", "-H", "a:2", "--slots-per-host", "2"],
     "--slots-per-host needs --host-discovery-script (-H/--hostfile give each host's slots"),
    (["--elastic", "-H", "a:4", "--min-np", "3", "--max-np", "2"], "--min-np 3 is above --max-np 2"),
    (["--elastic", "--host-discovery-script", "echo a:4", "-H", "a:4"],
     "--host-discovery-script gives the hosts: drop -H/--hostfile"),
    (["--elastic", "--host-discovery-script", "echo a:4", "--min-np", "0"],
     "--min-np must be at least 1, not 0"),
    (["--elastic", "--host-discovery-script", "echo a:4", "--blacklist-cooldown-range", "0",
      "10"], "need 1 <= MIN <= MAX <= 3600 seconds"),
    (["--elastic", "--host-discovery-script", "exit 3"], "failed with exit code 3"),
    (["--elastic", "--host-discovery-script", "echo 'a b'"], "printed 'a b' on line 1"),
    (["--elastic", "--host-discovery-script", "printf 'a:2\\na:2\\n'"], "named host a twice"),
])
def test_bad_input_stops_perseusrun_before_any_rank(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv + ["python", "-c", "pass"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert said in err, err


def test_a_persist_folder_that_is_a_link_stops_perseusrun(tmp_path, monkeypatch, capsys):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "link"))
    with pytest.raises(SystemExit) as e:
        main(["--elastic", "--host-discovery-script", "echo localhost:2", "python", "-c", "pass"])
    assert e.value.code == 2
    assert ("PERSEUS_ELASTIC_PERSIST_DIR (the commits and the notice of host changes): "
            "refusing to use the folder %s: it is a symbolic link" % (tmp_path / "link")
            in capsys.readouterr().err)


def test_the_first_start_waits_for_np_as_horovods_driver(tmp_path, monkeypatch):
    """-np 4 --min-np 2 and 2 slots: Horovod's driver waits for -np at the first start
    (--min-np after a reset); so does perseusrun, up to the elastic timeout."""
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    messages = []
    opts = {"script": "echo localhost:2", "slots": 1, "min_np": 2, "start_np": 4, "max_np": 0,
            "elastic_timeout": 0, "discovery_timeout": 5, "cooldown_range": None, "limit": 0,
            "first": [("localhost", 2)]}
    rc = le.run_growing(lambda hosts, np: [sys.executable, "-c", "pass"], clean_env(), opts,
                        say=messages.append)
    assert rc == 1 and ("fewer than -np 4 (the first start waits for -np)"
                        in messages[-1]), messages


def test_horovod_elastic_timeout_must_be_seconds(monkeypatch, capsys):
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "ten")
    with pytest.raises(SystemExit) as e:
        main(["--elastic", "--host-discovery-script", "echo localhost:2", "python", "-c", "pass"])
    assert e.value.code == 2
    assert "HOROVOD_ELASTIC_TIMEOUT must be a whole number of seconds, not 'ten'" in \
        capsys.readouterr().err


def test_a_hanging_script_stops_perseusrun(monkeypatch, capsys):
    monkeypatch.setenv("PERSEUS_HOST_DISCOVERY_TIMEOUT", "0.5")
    with pytest.raises(SystemExit) as e:
        main(["--elastic", "--host-discovery-script", "sleep 30", "python", "-c", "pass"])
    assert e.value.code == 2
    assert "did not finish within 0.5 s" in capsys.readouterr().err


def test_the_plan_keeps_old_hosts_first_and_bounds_np():
    none = le.Blacklist()
    found = [("c", 2), ("a", 2), ("b", 2)]
    assert le.plan(found, [], none, 2, 0) == ([("c", 2), ("a", 2), ("b", 2)], 6)
    assert le.plan(found, ["b", "a"], none, 2, 3) == ([("b", 2), ("a", 2)], 3)
    assert le.plan([("a", 1)], [], none, 2, 4) is None  # below --min-np
    out = le.Blacklist()
    out.add("b")
    assert le.plan(found, ["b", "a"], out, 2, 0) == ([("a", 2), ("c", 2)], 4)


def test_blacklist_cooldown_is_horovods():
    """Horovod's HostState: the n-th blacklisting keeps a host out for
    MIN * 2**n + uniform(0, 1) * MIN seconds, clamped to [MIN, MAX]; without a range, for
    the rest of the job; this machine never."""
    now = [1000.0]
    b = le.Blacklist((10, 100), clock=lambda: now[0], uniform=lambda: 0.5)
    assert [b.add("n1") - now[0] for _ in range(4)] == [25.0, 45.0, 85.0, 100.0]
    assert b.blocked("n1") and not b.blocked("n2")
    now[0] += 101
    assert not b.blocked("n1")
    forever = le.Blacklist()
    forever.add("n1")
    assert forever.until["n1"] == float("inf")
    assert forever.add("localhost") is None and not forever.blocked("localhost")


def test_the_ranks_notice_says_a_newer_generation_once(tmp_path):
    """What rank 0 checks at commit: a stat, and the file read only when it changed."""
    path = str(tmp_path / "hosts.run")
    le.write_notice(path, 0, [("localhost", 2)], 2)
    watch = elastic._HostWatch(path, 0)
    assert not watch.updated()
    le.write_notice(path, 1, [("localhost", 4)], 4)
    assert watch.updated()
    assert not watch.updated()  # unchanged since
    assert open(path).read() == "1 4 localhost:4 -\n"
    le.write_notice(path, 2, [("localhost", 4), ("node7", 2)], 6, {"node7", "node6"})
    assert watch.read() == (2, 6, [("localhost", 4), ("node7", 2)], ["node6", "node7"])


def test_a_job_without_a_discovery_script_checks_nothing(monkeypatch):
    monkeypatch.delenv("PERSEUS_ELASTIC_NOTICE", raising=False)
    monkeypatch.setattr(elastic, "_watch", [None, False])
    calls = []
    state = elastic.ObjectState(bcast_object=lambda v: calls.append(v) or v,
                                get_rank=lambda: 0, epoch=0)
    state.commit()
    assert calls == []  # no broadcast: nothing is sent at commit


def test_the_stop_for_new_hosts_spares_the_last_garbage_collection(monkeypatch):
    """Ranks that stop for new hosts exit with HOSTS_UPDATED_EXIT, the GC frozen: with
    torch loaded, the interpreter's collections at exit made the old job's exit take
    3.1-4.5 s of each restart here, 0.6-0.7 s frozen (medians, 2 -> 4 -> 2 ranks, load
    6-12: benchmarks/elastic_recovery.py --hosts-added)."""
    monkeypatch.setattr(elastic.basics, "rank", lambda: 1)
    monkeypatch.setattr(elastic.basics, "shutdown", lambda: None)
    state = elastic.ObjectState(bcast_object=lambda v: v, get_rank=lambda: 1, epoch=0)
    gc.unfreeze()
    try:
        with pytest.raises(SystemExit) as stop:
            elastic._stop_for_new_hosts(state)
        assert stop.value.code == elastic.HOSTS_UPDATED_EXIT
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # this process goes on


# Stands in for mpirun in run_growing's loop: prints its run and hosts; in the first run
# it prints mpirun's report of a rank that died on LOST (Hydra's banner or Open MPI 5's
# message, wrapped as prterun wraps it) and
# exits as mpirun does then (9); the second run succeeds.
FAKE_MPIRUN = r"""
import os, sys
run = int(os.environ["PERSEUS_ELASTIC_RESTARTS"])
print("run %d hosts %s" % (run, sys.argv[1]), flush=True)
if run == 0:
    if sys.argv[2] == "hydra":
        print("=   PID 123 RUNNING AT %s" % sys.argv[3], flush=True)
    else:
        print("-----\nprterun noticed that process rank 1 with PID 123 on node %s exited on"
              "\nsignal 9 (Killed).\n-----" % sys.argv[3], file=sys.stderr, flush=True)
    sys.exit(9)
"""


@pytest.mark.parametrize("form,reported,blacklisted", [
    ("hydra", "node7", True), ("ompi", "node7.cluster", True), ("hydra", "localhost", False)])
def test_a_host_that_lost_a_rank_is_blacklisted(tmp_path, monkeypatch, capfd, form, reported,
                                                blacklisted):
    """A rank killed on node7 (mpirun's output names the host): perseusrun blacklists
    node7 (no --blacklist-cooldown-range: for the rest of the job, as Horovod) and the
    restart runs on the hosts left; a host of this machine is never blacklisted."""
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    found = [("node7", 2), ("localhost", 2)]
    opts = {"script": "printf 'node7:2\\nlocalhost:2\\n'", "slots": 1, "min_np": 2,
            "max_np": 0, "elastic_timeout": 5, "discovery_timeout": 5, "cooldown_range": None,
            "limit": 1, "first": found}
    if reported == "localhost":
        found.reverse()
    messages = []
    rc = le.run_growing(lambda hosts, np: [sys.executable, "-c", FAKE_MPIRUN, le.describe(hosts),
                                           form, reported], clean_env(), opts,
                        say=messages.append)
    out = capfd.readouterr().out
    assert rc == 0, (out, messages)
    assert "run 0 hosts %s" % le.describe(found) in out, out
    if blacklisted:
        assert ("host node7 lost a rank: blacklisted for the rest of the job (Horovod's "
                "cooldown)") in messages, messages
        assert "run 1 hosts localhost:2" in out, out
    else:
        assert "host localhost lost a rank: not blacklisted (this machine)" in messages, messages
        assert "run 1 hosts localhost:2,node7:2" in out, out


# What Open MPI 5's mpirun prints on stderr when its runtime loses a host's daemon and
# ends the job (PRRTE 3.0.11's text, as tests/launch/test_fault_tolerance_hosts.py saw it).
NODE_DIED = """--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-hostA-19373@0,0] on node hostA
  Remote daemon: [prterun-hostA-19373@0,1] on node %s

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
--------------------------------------------------------------------------
"""
DAEMON_GONE = """--------------------------------------------------------------------------
A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable, or the executable was unable to find its
required supporting libraries. In some cases, the daemon was
able to execute, but was unable to complete a TCP connection
back to hostA:
  Local host:    hostA
  Remote host:   %s
  Daemon exit status: 137
This may also be caused by a firewall on the remote host. Please
check that any firewall (e.g., iptables) has been disabled and
try again.
--------------------------------------------------------------------------
"""
# What PRRTE 3.0.11 printed once when its state machine failed after a shrink in place and
# a spawn onto another host at once; it then killed the ranks, and mpirun exited with 0.
RUNTIME_FAILED = "[hostA:06173] UNSUPPORTED DAEMON ERROR STATE: NO PATH TO TARGET\n"
# Stands in for mpirun --with-ft ulfm: prints a line of the job's output, then argv[1]
# (a report, or nothing) on stderr, and exits with argv[2].
FAKE_ULFM_MPIRUN = r"""
import sys
print("step 1 loss 0.5", flush=True)
sys.stderr.write(sys.argv[1])
sys.exit(int(sys.argv[2]))
"""


@pytest.mark.parametrize("report,code,want,said", [
    (NODE_DIED % "hostB", 0, le.HOST_LOST_EXIT,
     "Open MPI ended the job after losing host hostB (hostB: its daemon there stopped "
     "answering; mpirun's exit code 0, the job did not finish); exit code 69"),
    (DAEMON_GONE % "hostB", 0, le.HOST_LOST_EXIT,
     "Open MPI ended the job after losing host hostB (hostB: its daemon there failed to "
     "report back; mpirun's exit code 0, the job did not finish); exit code 69"),
    ("", 0, 0, None),
    ("", 3, 3, None),
    (NODE_DIED % "hostB", 3, 3, "Open MPI ended the job after losing host hostB (hostB: its "
     "daemon there stopped answering; mpirun's exit code 3); exit code 3"),
    (RUNTIME_FAILED, 0, le.HOST_LOST_EXIT, "Open MPI's runtime failed and ended the job (NO "
     "PATH TO TARGET; mpirun's exit code 0, the job did not finish); exit code 69"),
])
def test_a_ulfm_job_that_lost_a_host_does_not_end_with_0(capfd, report, code, want, said):
    """perseusrun --elastic on a ULFM core runs mpirun as its child: Open MPI 5 ends the
    job after losing a host's daemon yet exits with 0, so perseusrun says so and ends with
    HOST_LOST_EXIT; mpirun's output goes through unchanged, and its exit code stays where
    it is not 0 or no host was lost."""
    messages = []
    rc = le.run_watching([sys.executable, "-c", FAKE_ULFM_MPIRUN, report, str(code)],
                         clean_env(), say=messages.append)
    out, err = capfd.readouterr()
    assert rc == want, (messages, err)
    assert out == "step 1 loss 0.5\n" and err == report  # passed through as it was
    assert messages == ([said] if said else []), messages


# The start of a stand-in for mpirun under run_growing: it prints its run and hosts
# (argv[1]), then does what follows in the first run only.
SAYS_ITS_RUN = ("import os, sys, time\n"
                "print('run %s hosts %s' % (os.environ['PERSEUS_ELASTIC_RESTARTS'], "
                "sys.argv[1]), flush=True)\n"
                "if os.environ['PERSEUS_ELASTIC_RESTARTS'] == '0':\n")


def growing_opts(script, first, **more):
    """run_growing's options for a stand-in job: --min-np 2, 5 s timeouts, 3 restarts."""
    return dict({"script": script, "slots": 1, "min_np": 2, "max_np": 0, "elastic_timeout": 5,
                 "discovery_timeout": 5, "cooldown_range": None, "limit": 3, "first": first},
                **more)


def test_a_job_open_mpis_runtime_ended_restarts_on_the_same_hosts(tmp_path, monkeypatch,
                                                                   capfd):
    """Open MPI's runtime says it failed and mpirun exits with 0 (the job's ranks killed,
    the training not finished): under a discovery script perseusrun restarts the job on
    the same hosts, none blacklisted, and it resumes there. Before, perseusrun took the
    0 for the end of the training, removed the persisted commit and ended with 0."""
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    listed = tmp_path / "hosts"
    listed.write_text("localhost:2\n")
    fake = (SAYS_ITS_RUN +
            "    sys.stderr.write(sys.argv[2])\n")
    opts = growing_opts("cat %s" % listed, [("localhost", 2)], grow=True)
    messages = []
    rc = le.run_growing(lambda hosts, np: [sys.executable, "-c", fake, le.describe(hosts),
                                           RUNTIME_FAILED], clean_env(), opts,
                        say=messages.append)
    out, err = capfd.readouterr()
    assert rc == 0, (out, err, messages)
    assert ("Open MPI's runtime failed and ended the job: restarting the job (restart 1 of at "
            "most 3, --reset-limit), which resumes from its last persisted commit") in messages, \
        messages
    assert not [m for m in messages if "blacklisted" in m], messages
    assert out.splitlines() == ["run 0 hosts localhost:2", "run 1 hosts localhost:2"], out


HYDRA_PROXY_LOST = ("[mpiexec@localhost] control_cb (/mpich-5.0.2/src/pm/hydra/mpiexec/"
                    "pmiserv_cb.c:280): assert (!closed) failed\n")


@pytest.mark.parametrize("silent", [True, False])
def test_a_host_hydra_lost_whole_is_found_by_asking_each(tmp_path, monkeypatch, capfd, silent):
    """MPICH's Hydra lost a host whole and names none (its proxy's connection closed, exit
    code 255): perseusrun asks each other host through Hydra's launch agent
    (HYDRA_LAUNCHER_EXEC, here a stand-in that fails for node7 when `silent`). node7 not
    answering is blacklisted and the job restarts on localhost; where every host
    answers, it restarts on the same hosts. Before, perseusrun ended with 255."""
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    agent = tmp_path / "agent"
    agent.write_text("#!/bin/sh\necho \"$@\" >> %s\n%s\n" % (
        tmp_path / "asked", '[ "$1" = node7 ] && exit 255; exit 0' if silent else "exit 0"))
    agent.chmod(0o755)
    fake = (SAYS_ITS_RUN +
            "    sys.stderr.write(sys.argv[2])\n"
            "    sys.exit(255)\n")
    opts = growing_opts(None, [("localhost", 2), ("node7", 2)])
    messages = []
    rc = le.run_growing(lambda hosts, np: [sys.executable, "-c", fake, le.describe(hosts),
                                           HYDRA_PROXY_LOST],
                        clean_env({"HYDRA_LAUNCHER_EXEC": str(agent)}), opts,
                        say=messages.append)
    out, err = capfd.readouterr()
    assert rc == 0, (out, err, messages)
    assert open(tmp_path / "asked").read() == "node7 true\n"  # not this machine
    if silent:
        assert ("host node7 does not answer (%s node7 true) after Hydra lost a host's proxy: "
                "blacklisted for the rest of the job (Horovod's cooldown)" % agent) in messages
        assert out.splitlines() == ["run 0 hosts localhost:2,node7:2", "run 1 hosts localhost:2"]
    else:
        assert ("Hydra lost a host's proxy, naming no host (every host answers: the same hosts "
                "again): restarting the job (restart 1 of at most 3, --reset-limit), which "
                "resumes from its last persisted commit") in messages, messages
        assert out.splitlines() == ["run 0 hosts localhost:2,node7:2",
                                    "run 1 hosts localhost:2,node7:2"]


def test_a_new_host_lost_in_a_grow_is_blacklisted(tmp_path, monkeypatch, capfd):
    """The script adds node8 while the job runs on localhost; the grow in place spawns
    there, Open MPI cannot start its daemon and ends the job (its report, mpirun's exit
    code 0): node8 is one of the job's hosts (the plan the ranks were told), so it is
    blacklisted at once and the job restarts on localhost alone. Before, it was 'not
    one of the job's hosts', and the restart went to node8 again."""
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    listed = tmp_path / "hosts"
    listed.write_text("localhost:2\n")
    fake = (SAYS_ITS_RUN +
            "    open(sys.argv[3], 'w').write('localhost:2\\nnode8:2\\n')\n"
            "    for _ in range(200):\n"  # until perseusrun told the ranks (a new generation)
            "        if open(os.environ['PERSEUS_ELASTIC_NOTICE']).read().split()[0] != '0':\n"
            "            break\n"
            "        time.sleep(0.05)\n"
            "    sys.stderr.write(sys.argv[2])\n")
    opts = growing_opts("cat %s" % listed, [("localhost", 2)], grow=True)
    messages = []
    rc = le.run_growing(lambda hosts, np: [sys.executable, "-c", fake, le.describe(hosts),
                                           DAEMON_GONE % "node8", str(listed)],
                        clean_env(), opts, say=messages.append)
    out, err = capfd.readouterr()
    assert rc == 0, (out, err, messages)
    assert ("host node8 was lost (Open MPI lost its daemon): blacklisted for the rest of "
            "the job (Horovod's cooldown)") in messages, messages
    assert out.splitlines() == ["run 0 hosts localhost:2", "run 1 hosts localhost:2"], out


def test_signals_to_a_ulfm_perseusrun_go_to_mpirun(tmp_path):
    """SIGTERM to perseusrun reaches mpirun (as it reached an exec'd one), whose exit code
    perseusrun keeps."""
    ready = tmp_path / "ready"
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
              "open(%r, 'w').close()\n"
              "time.sleep(60)\n" % str(ready))
    runner = ("import sys\nfrom perseus import launcher_elastic as le\n"
              "sys.exit(le.run_watching([sys.executable, '-c', %r], None))\n" % script)
    proc = subprocess.Popen([sys.executable, "-c", runner], env=clean_env())
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7


@pytest.mark.parametrize("report", [NODE_DIED, DAEMON_GONE])
def test_a_host_open_mpi_lost_is_blacklisted_and_the_job_restarted(tmp_path, monkeypatch, capfd,
                                                                   report):
    """--host-discovery-script on Open MPI 5: mpirun reports it lost node7's daemon and
    exits with 0 (the job ended, unfinished): a host failure, so node7 is blacklisted and
    the job restarted on the hosts left; past the --reset-limit, exit HOST_LOST_EXIT."""
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    fake = ("import os, sys\n"
            "print('run %s hosts %s' % (os.environ['PERSEUS_ELASTIC_RESTARTS'], sys.argv[1]),"
            " flush=True)\n"
            "if 'node7' in sys.argv[1]: sys.stderr.write(sys.argv[2])\n")
    found = [("node7", 2), ("localhost", 2)]
    for limit, want in ((1, 0), (0, le.HOST_LOST_EXIT)):
        opts = {"script": "printf 'node7:2\\nlocalhost:2\\n'", "slots": 1, "min_np": 2,
                "max_np": 0, "elastic_timeout": 5, "discovery_timeout": 5,
                "cooldown_range": None, "limit": limit, "first": found}
        messages = []
        rc = le.run_growing(lambda hosts, np: [sys.executable, "-c", fake, le.describe(hosts),
                                               report % "node7"], clean_env(), opts,
                            say=messages.append)
        out, err = capfd.readouterr()
        assert rc == want, (out, err, messages)
        assert ("host node7 was lost (Open MPI lost its daemon): blacklisted for the rest of "
                "the job (Horovod's cooldown)") in messages, messages
        if want == 0:
            assert "run 1 hosts localhost:2" in out, out
        else:
            assert "giving up" in messages[-1], messages
            assert ("perseusrun: Open MPI ended the job after losing host node7 (" in err
                    and "; exit code 69" in err), err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


@pytest.mark.parametrize("notice, grow, size, want, said", [
    ((1, [("localhost", 4)], 4), "1", 2, (None, 2, None), ""),  # more ranks, this machine
    ((1, [("localhost", 2), ("node7", 2)], 4), "1", 2,          # another host: placed there
     (None, 2, ("node7:2", "node7:2")), ""),
    ((1, [("localhost", 3), ("node7", 2)], 5), "1", 2,          # both: one here, two there
     (None, 3, ("localhost:1,node7:2", "node7:2")), ""),
    ((1, [("node7", 4)], 4), "1", 2, None,                      # this machine gone: restart
     "not resized in place (no host of the running ranks keeps a rank)"),
    ((1, [("localhost", 1), ("node7", 3)], 4), "1", 2,          # one leaves, 3 on node7
     (True, 3, ("node7:3", "node7:3")), ""),
    ((1, [("localhost", 2)], 2), "1", 4, (True, 0, None), ""),  # fewer ranks: shrink
    ((1, [("localhost", 2), ("node7", 2)], 4), "1", 6,          # 4 leave, 2 on node7
     (True, 2, ("node7:2", "node7:2")), ""),
    ((1, [("localhost", 2), ("node8", 2)], 4, {"node7"}), "1", 2, None,  # a daemon on node7
     "not resized in place (placing new ranks on node8 while Open MPI's daemons run on "
     "node7, which Open MPI 5.0.11 fails at)"),
    ((1, [("localhost", 4)], 4), "", 2, None, "")])             # no ULFM route: restart
def test_the_ranks_resize_in_place_keeping_their_hosts(tmp_path, monkeypatch, capsys,
                                                       notice, grow, size, want, said):
    """At HostsUpdatedInterrupt rank 0 reads the notice (one broadcast tells every rank)
    and, where perseusrun said a change may be made in place (PERSEUS_ELASTIC_GROW=1: a
    ULFM core), the ranks say where each runs (one allgather; here all on this machine):
    the ranks whose slots are gone leave (whether this one stays; None: all stay), then
    the new ones are spawned, placed by host where one is not this machine (the new
    ranks' hosts, and the hosts to add with their slots). Where no running rank's host
    keeps one, where new ranks would be placed on hosts while Open MPI's daemons run on
    another host than perseusrun's (the notice's last field), or without the route, the
    restart (None), rank 0 saying why."""
    from perseus.common import objects
    path = str(tmp_path / "hosts.run")
    le.write_notice(path, *notice)
    monkeypatch.setenv("PERSEUS_ELASTIC_GROW", grow)
    monkeypatch.setattr(elastic, "_watch", [elastic._HostWatch(path, 0), True])
    monkeypatch.setattr(elastic.basics, "rank", lambda: 0)
    monkeypatch.setattr(elastic.basics, "size", lambda: size)
    monkeypatch.setattr(elastic.basics, "fault_tolerance", lambda: (True, "ULFM"))
    gathered = []
    monkeypatch.setattr(objects, "allgather_object",
                        lambda v: gathered.append(v) or [v] * size)
    sent = []
    state = elastic.ObjectState(bcast_object=lambda v: sent.append(v) or v, get_rank=lambda: 0)
    got = elastic_in_place.decide(state, elastic._resize_watch())
    leavers = size - (notice[2] - want[1]) if want and want[0] else 0  # all on this host
    assert got == (want and elastic_in_place.Resize(*want, [os.getpid()] * leavers)), got
    assert len(sent) == 1  # one broadcast tells every rank
    assert len(gathered) == (1 if grow else 0)
    assert elastic._watch[0].generation == (1 if want else 0)
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("np, hosts, machines, stays", [
    (2, [("localhost", 2)], ["localhost"] * 4, [True, True, False, False]),
    (3, [("localhost", 3)], ["localhost"] * 4, None),  # rank 3, spawned, would leave
    (2, [("hostA", 2)], ["hostA", "hostA", None, None], [True, True, False, False]),
    # perseusrun's plan fills hosts in order: hostA keeps 2, hostB 1, its lowest rank
    (3, [("hostA", 2), ("hostB", 2)], ["hostA", "hostB", "hostA", "hostB"],
     [True, True, True, False]),
    (2, [("hostB", 2)], ["hostA", "hostA", "hostB", "hostB"],  # rank 0's host removed
     [False, False, True, True]),
    (3, [("hostA", 3)], ["hostA", "hostA", None, None],  # hostB replaced: 1 more on hostA
     [True, True, False, False]),
    (2, [("hostC", 2)], ["hostA", "hostA", "hostB", "hostB"], None)])  # none stays
def test_a_resize_in_place_keeps_each_hosts_lowest_ranks(np, hosts, machines, stays):
    """elastic_in_place.staying_ranks: each host of the notice keeps as many of its ranks
    as perseusrun's plan gives it, its lowest (a grow adds the rest); a rank started by a
    grow that would leave, or no rank kept, takes the restart, saying which."""
    spawned = [False, False, False, True] if np == 3 and hosts[0][0] == "localhost" else \
        [False] * 4
    got, why = elastic_in_place.staying_ranks(np, hosts, machines, spawned)
    assert got == stays
    assert (why is None) == (stays is not None)
    if stays is None:
        assert ("no host of the running ranks keeps a rank" if hosts[0][0] == "hostC" else
                "rank(s) 3 would leave, started by a grow") in why


@pytest.mark.parametrize("places, hosts, add_hosts", [
    (None, None, None),                                  # one machine: MPI's choice
    (("node7:2", "node7:2"), b"node7:2", b"node7:2"),     # a new host, added
    (("localhost:1,node7:1", ""), b"localhost:1,node7:1", None)])  # node7 in the job already
def test_a_grow_asks_the_core_for_its_places(monkeypatch, places, hosts, add_hosts):
    """elastic_in_place.grow hands decide's places to perseus_grow as bytes or NULL (an
    empty str there was a ctypes error at a second grow onto a host already in the job),
    and, placed, runs the command line under env with the variables perseusrun named
    (PERSEUS_SPAWN_ENV), no other."""
    from perseus.common import library
    calls = []
    monkeypatch.setattr(library, "perseus_grow", lambda *args: calls.append(args) or 0)
    monkeypatch.setattr(library, "check", lambda status: status)
    for name in ("shutdown", "init"):
        monkeypatch.setattr(elastic.basics, name, lambda: None)
    monkeypatch.setattr(elastic.basics, "rank", lambda: 1)
    monkeypatch.setattr(elastic_in_place, "spawn_command",
                        lambda: ("/venv/bin/python", ["train.py"]))
    monkeypatch.setenv("PTEST_GROW_VAR", "kept")
    monkeypatch.setenv("PTEST_SECRET", "not perseusrun's")
    monkeypatch.setenv("PERSEUS_SPAWN_ENV", "PTEST_GROW_VAR,PERSEUS_SPAWN_ENV,PTEST_UNSET")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")

    class Persister:
        def write_last(self, state):
            pass

    state = elastic.ObjectState(bcast_object=lambda v: v, get_rank=lambda: 0)
    state._persister = Persister()
    elastic_in_place.grow(state, 2, places)
    (count, program, args, nargs, wdir, got_hosts, got_add), = calls
    assert (count, got_hosts, got_add) == (2, hosts, add_hosts)
    words = args.split(b"\0")[:-1]
    assert len(words) == nargs
    if places is None:
        assert (program, words) == (b"/venv/bin/python", [b"train.py"])
    else:
        assert program.endswith(b"/env") and words[-2:] == [b"/venv/bin/python", b"train.py"]
        assert b"PTEST_GROW_VAR=kept" in words
        assert not [w for w in words if w.startswith((b"OMPI_", b"PTEST_SECRET", b"PTEST_UNSET"))]


def test_a_ulfm_core_follows_its_hosts_under_ulfm_oversubscribed(monkeypatch, tmp_path, capsys):
    """On a ULFM core the discovery job runs under mpirun --with-ft ulfm --oversubscribe
    (the spawned ranks go beyond mpirun's slots) and perseusrun says ranks added here
    join the running job; on the MPICH core, without either (the restart)."""
    import perseus.launcher as launcher
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(launcher, "check_core_mpi", lambda mpirun, flavour: None)
    argv = ["--elastic", "--dry-run", "--mpi-flavour", "openmpi", "--host-discovery-script",
            "echo localhost:2", sys.executable, "-c", "pass"]
    for ulfm in (True, False):
        monkeypatch.setattr(launcher, "core_has_ulfm", lambda: (ulfm, "why"))
        assert main(argv) == 0
        out, err = capsys.readouterr()
        command = out.split("): ", 1)[1].split()
        assert (("--with-ft" in command and "--oversubscribe" in command) == ulfm), out
        assert ("ranks removed leave the running job and ranks added join it (ULFM: in "
                "place" in err) == ulfm, err
        # What a grow onto another host hands the new ranks: perseusrun's forwarded names.
        spawn_env = os.environ.pop("PERSEUS_SPAWN_ENV", None)
        assert ("-x PERSEUS_SPAWN_ENV" in out) == ulfm, out
        if ulfm:
            names = spawn_env.split(",")
            assert "PATH" in names and "PERSEUS_ELASTIC_RUN_ID" in names, names
            assert not [n for n in names if n.startswith(("OMPI_", "HOME"))], names


# Fixed hosts (-H/--hostfile) without ULFM: Horovod's FixedHosts, a discovery that never
# changes, through run_growing. Stands in for mpirun: prints its run, np, hosts and whether
# the ranks would watch the notice; run 0 reports a rank lost on argv[4] (Hydra's banner or
# Open MPI's message) and exits as mpirun does then (9); with argv[5] "wait", run 1 waits
# for a newer notice and stops as the ranks do at a commit (HOSTS_UPDATED_EXIT); the others
# succeed.
FIXED_MPIRUN = r"""
import os, sys, time
run, notice = int(os.environ["PERSEUS_ELASTIC_RESTARTS"]), os.environ["PERSEUS_ELASTIC_NOTICE"]
print("run %d np %s hosts %s watch %s" % (run, sys.argv[2], sys.argv[1],
                                          "yes" if notice else "no"), flush=True)
if run == 0:
    if sys.argv[3] == "hydra":
        print("=   PID 123 RUNNING AT %s" % sys.argv[4], flush=True)
    else:
        print("prterun noticed that process rank 1 with PID 123 on node %s exited on\nsignal "
              "9 (Killed)." % sys.argv[4], file=sys.stderr, flush=True)
    sys.exit(9)
if run == 1 and sys.argv[5] == "wait":
    mine, deadline = int(os.environ["PERSEUS_ELASTIC_GENERATION"]), time.monotonic() + 20
    while time.monotonic() < deadline:
        if notice and int(open(notice).read().split()[0]) > mine:
            sys.exit(75)
        time.sleep(0.05)
"""


def run_fixed(tmp_path, monkeypatch, flags, form="hydra", lost="node7", then="end",
              mpirun=FIXED_MPIRUN, in_place=False):
    """run_growing on the fixed hosts node7:2,localhost:2 with perseusrun's `flags`, the
    options as main() makes them (in_place: on a ULFM core) -> (exit code, messages,
    seconds)."""
    import perseus.launcher as launcher
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(le, "DISCOVER_PERIOD_S", 0.1)  # CI time: the loop's period
    args = launcher.make_parser().parse_args(["--elastic", "-H", "node7:2,localhost:2"] + flags
                                             + ["python"])
    assert launcher.launcher_flags.check_elastic(args, {}) is None
    opts = dict(launcher.growing_options(args, {}, *launcher.fixed_hosts(args)),
                in_place=in_place)
    messages = []
    started = time.monotonic()
    rc = le.run_growing(lambda hosts, np: [sys.executable, "-c", mpirun, le.describe(hosts),
                                           str(np), form, lost, then], clean_env(), opts,
                        say=messages.append)
    return rc, messages, time.monotonic() - started


@pytest.mark.parametrize("form,lost,restart", [
    ("hydra", "node7", "run 1 np 2 hosts localhost:2 watch no"),
    ("ompi", "node7.cluster", "run 1 np 2 hosts localhost:2 watch no"),
    ("hydra", "localhost", "run 1 np 4 hosts node7:2,localhost:2 watch no")])
def test_fixed_hosts_restart_without_the_host_that_lost_a_rank(tmp_path, monkeypatch, capfd,
                                                               form, lost, restart):
    """perseusrun --elastic -H node7:2,localhost:2 --min-np 2 without ULFM: a rank lost on
    node7 blacklists it (no --blacklist-cooldown-range: for the rest of the job, as
    Horovod) and the restart runs on the host left with the 2 ranks it offers; the ranks
    watch no notice (the plan cannot change while they run). A host of this machine is
    never blacklisted: the restart keeps both hosts and 4 ranks."""
    rc, messages, _ = run_fixed(tmp_path, monkeypatch, ["--min-np", "2"], form, lost)
    out = capfd.readouterr().out
    assert rc == 0, (out, messages)
    assert "run 0 np 4 hosts node7:2,localhost:2 watch no" in out, out
    assert restart in out and "run 2" not in out, out
    said = ("host node7 lost a rank: blacklisted for the rest of the job (Horovod's cooldown)"
            if lost != "localhost" else "host localhost lost a rank: not blacklisted (this machine)")
    assert said in messages, messages


# Stands in for MPICH's mpiexec across hosts: run 0 prints argv[3] % argv[4] (a line
# of Hydra's banner naming the host, or none) and exits with 255, as mpiexec did in 4
# runs of 5 when a rank on another host was SIGKILLed (its proxies failing on the way
# out: tests/launch/test_fault_tolerance_hosts.py); later runs succeed.
HYDRA_ACROSS_HOSTS = r"""
import os, sys
run = int(os.environ["PERSEUS_ELASTIC_RESTARTS"])
print("run %d np %s hosts %s" % (run, sys.argv[2], sys.argv[1]), flush=True)
if run == 0:
    print("=" * 83 + "\n" + sys.argv[3].replace("%s", sys.argv[4]) + "\n" + "=" * 83,
          flush=True)
    sys.exit(255)
"""


@pytest.mark.parametrize("banner,restarted", [
    ("=   PID 123 RUNNING AT %s\n=   EXIT CODE: 9", True),                  # MPICH's Hydra
    ("=   RANK 3 PID 123 RUNNING AT %s\n=   KILLED BY SIGNAL: 9 (Killed)", True),  # Intel's
    ("[mpiexec@%s] main: process manager error waiting for completion", False)])
def test_a_rank_lost_on_a_host_restarts_whatever_mpiruns_exit_code(
        tmp_path, monkeypatch, capfd, banner, restarted):
    """Hydra's banner naming node7 is a rank killed there, also where mpiexec exits with
    255 (not a signal's number): node7 is blacklisted and the job restarted on the host
    left. Without a report of a rank lost, 255 stays a failure not restarted."""
    rc, messages, _ = run_fixed(tmp_path, monkeypatch, ["--min-np", "2"], banner, "node7",
                                mpirun=HYDRA_ACROSS_HOSTS)
    out = capfd.readouterr().out
    if not restarted:
        assert rc == 255 and "run 1" not in out, (out, messages)
        assert messages[-1].startswith("the job failed with exit code 255, which is neither "
                                       "a rank killed by a signal"), messages
        return
    assert rc == 0, (out, messages)
    assert ("host node7 lost a rank: blacklisted for the rest of the job (Horovod's "
            "cooldown)") in messages, messages
    assert ("a rank was killed (mpirun's exit code 255): restarting the job (restart 1 of at "
            "most 3, --reset-limit), which resumes from its last persisted commit") in messages
    assert "run 1 np 2 hosts localhost:2" in out and "run 2" not in out, out


def test_a_fixed_host_comes_back_after_its_cooldown(tmp_path, monkeypatch, capfd):
    """--blacklist-cooldown-range 1 1: node7, blacklisted for 1 s after losing a rank,
    comes back once it cooled down, as a host Horovod's driver sees added: the ranks
    running on localhost:2 (they watch the notice) stop at a commit and the job restarts
    on both hosts with 4 ranks, localhost first (it held rank 0)."""
    rc, messages, took = run_fixed(tmp_path, monkeypatch, [
        "--min-np", "2", "--blacklist-cooldown-range", "1", "1"], then="wait")
    out = capfd.readouterr().out
    assert rc == 0, (out, messages)
    assert "host node7 lost a rank: blacklisted for 1 s (Horovod's cooldown)" in messages, messages
    assert "run 1 np 2 hosts localhost:2 watch yes" in out, out
    assert any(m.startswith("the hosts changed: 4 rank(s) on localhost:2,node7:2 next")
               for m in messages), messages
    assert "run 2 np 4 hosts localhost:2,node7:2 watch yes" in out, out
    assert took >= 0.9, took  # not before the cooldown


@pytest.mark.parametrize("flags,rc,said", [
    (["--blacklist-cooldown-range", "1", "1"], 0,
     "the hosts of -H/--hostfile offer 2 slot(s) (node7:2,localhost:2; blacklisted: node7 (for "
     "1 s more)), fewer than --min-np 4: waiting up to 600 s for hosts"),
    (["--blacklist-cooldown-range", "1", "1", "--elastic-timeout", "0"], 1,
     "timed out after 0 s waiting for hosts (--elastic-timeout, HOROVOD_ELASTIC_TIMEOUT): the "
     "hosts of -H/--hostfile offer 2 slot(s) (node7:2,localhost:2; blacklisted: node7 (for 1 s "
     "more)), fewer than --min-np 4"),
    (["--elastic-timeout", "3"], 1, "the hosts of -H/--hostfile offer 2 slot(s) (node7:2,localhost:2; blacklisted: "
     "node7 (for the rest of the job)), fewer than --min-np 4, and no wait can bring enough "
     "back (a host blacklisted without --blacklist-cooldown-range stays out for the rest of "
     "the job): giving up")])
def test_fixed_hosts_below_min_np_wait_for_the_cooldown(tmp_path, monkeypatch, capfd, flags, rc,
                                                        said):
    """-H node7:2,localhost:2 (--min-np: -np, 4), node7 lost: the hosts left offer 2 slots.
    perseusrun waits for node7's cooldown, up to the elastic timeout, and restarts on both
    hosts with 4 ranks; past the timeout it fails saying so; with no cooldown range nothing
    can come back, and it fails at once, saying why."""
    got, messages, took = run_fixed(tmp_path, monkeypatch, flags)
    out = capfd.readouterr().out
    assert got == rc, (out, messages)
    assert any(said in m for m in messages), messages
    if rc == 0:
        assert "run 1 np 4 hosts node7:2,localhost:2" in out and took >= 0.9, (out, took)
    else:
        assert "run 1" not in out and took < 2, (out, took)  # no wait for what cannot come


def test_perseusrun_takes_fixed_hosts_through_the_loop(monkeypatch, tmp_path, capsys):
    """perseusrun --elastic -H on a core without ULFM: the fixed-host loop (its line says
    so; -np is also --max-np), and -np or --min-np above the slots is an error; on a ULFM
    core the same loop under mpirun --with-ft ulfm, its line saying that a rank that dies
    is left behind and a host lost whole restarts the job, unless every host is this
    machine (then one run, as without -H)."""
    import perseus.launcher as launcher
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(launcher, "check_core_mpi", lambda mpirun, flavour: None)
    argv = ["--elastic", "--dry-run", "--mpi-flavour", "mpich", "-H", "node7:2,localhost:2"]
    monkeypatch.setattr(launcher, "core_has_ulfm", lambda: (False, "no ULFM here"))
    assert main(argv + ["-np", "3", "--min-np", "2", "python", "t.py"]) == 0
    out, err = capsys.readouterr()
    assert ("no ULFM here, so a rank that dies cannot be left behind: the job runs on "
            "node7:2,localhost:2 with 3 rank(s); when a rank dies it starts again, at most 3 "
            "time(s) (--reset-limit), without the hosts that lost one (blacklisted for the rest "
            "of the job; never this machine), with the ranks the hosts left offer (at least "
            "--min-np 2)") in err, err
    assert "-np 3 -hosts node7:2,localhost:2 python t.py" in out, out
    for flags, said in ((["-np", "5"], "-np 5 is above the 4 slot(s) of -H/--hostfile"),
                        (["--min-np", "5"], "--min-np 5 is above the 4 slot(s)")):
        with pytest.raises(SystemExit):
            main(argv + flags + ["python", "t.py"])
        assert said in capsys.readouterr().err
    # A ULFM core: the same loop, under mpirun --with-ft ulfm (PRRTE's keepalive set), a
    # rank that dies left behind in place; a host lost whole restarts the job.
    monkeypatch.setattr(launcher, "core_has_ulfm", lambda: (True, "ULFM"))
    assert main(argv[:3] + ["openmpi"] + argv[4:] + ["--min-np", "2", "python", "t.py"]) == 0
    out, err = capsys.readouterr()
    assert "PRTE_MCA_oob_tcp_keepalive_time=5" in out and "--with-ft ulfm" in out, out
    assert "-H node7:2,localhost:2 " in out, out
    assert ("--elastic: the core's MPI has ULFM (mpirun --with-ft ulfm): a rank that dies is "
            "left behind and the others go on in place; "
            "the job runs on node7:2,localhost:2 with 4 rank(s), and when Open MPI loses a "
            "host whole (it then ends the job) it starts again, at most 3 time(s) "
            "(--reset-limit), without that host (blacklisted for the rest of the job; never "
            "this machine), with the ranks the hosts left offer (at least --min-np 2)") in err, err
    assert "no effect" not in err, err
    # Only this machine: no host can be lost that perseusrun outlives, so the one watched
    # run (nothing to restart, no commit persisted).
    assert main(["--elastic", "--dry-run", "--mpi-flavour", "openmpi", "-H", "localhost:4",
                 "python", "t.py"]) == 0
    out, err = capsys.readouterr()
    assert "--with-ft ulfm" in out and "-H localhost:4 " in out, out
    assert "when Open MPI loses a host" not in err and "starts again" not in err, err
    with pytest.raises(SystemExit):  # ULFM needs Open MPI's mpirun: before any rank starts
        main(argv + ["python", "t.py"])
    assert "--elastic needs Open MPI 5 with ULFM" in capsys.readouterr().err


# Fixed hosts on a ULFM core: stands in for mpirun --with-ft ulfm. Run 0 reports what
# argv[3] says and exits as mpirun does then: "host", PRRTE's report of node7's daemon
# lost ($PTEST_REPORT) and 0; "rank", a rank killed on node7 and 137 (under ULFM the others
# would have gone on: mpirun's code then is a failure of the job); later runs succeed.
ULFM_FIXED_MPIRUN = r"""
import os, sys
run = int(os.environ["PERSEUS_ELASTIC_RESTARTS"])
print("run %d np %s hosts %s" % (run, sys.argv[2], sys.argv[1]), flush=True)
if run == 0 and sys.argv[3] == "host":
    sys.stderr.write(os.environ["PTEST_REPORT"])
    sys.exit(0)
if run == 0 and sys.argv[3] == "rank":
    print("prterun noticed that process rank 1 with PID 123 on node node7 exited on\nsignal "
          "9 (Killed).", file=sys.stderr, flush=True)
    sys.exit(137)
"""


@pytest.mark.parametrize("lost,flags,want,said", [
    ("host", ["--min-np", "2"], 0, "Open MPI ended the job after losing host node7: restarting "
     "the job (restart 1 of at most 3, --reset-limit), which resumes from its last persisted "
     "commit"),
    ("host", ["--min-np", "2", "--reset-limit", "0"], le.HOST_LOST_EXIT,
     "Open MPI ended the job after losing host node7 and the job was already restarted 0 "
     "time(s), the --reset-limit: giving up"),
    ("host", [], le.HOST_LOST_EXIT, "fewer than --min-np 4, and no wait can bring enough back"),
    ("rank", ["--min-np", "2"], 137, "the job failed with exit code 137, and no host was lost: "
     "not restarted (under ULFM a rank that dies is left behind in place; only a host Open "
     "MPI loses whole restarts the job)")])
def test_ulfm_fixed_hosts_restart_only_for_a_host_lost(tmp_path, monkeypatch, capfd, lost, flags,
                                                       want, said):
    """perseusrun --elastic -H node7:2,localhost:2 on a ULFM core: Open MPI loses node7's
    daemon and ends the job with 0; node7 is blacklisted and the job restarted on
    localhost:2. Where it cannot be (--reset-limit 0; the 2 slots left below --min-np,
    Horovod's default -np: 4), perseusrun ends with HOST_LOST_EXIT and the line naming
    node7. A rank's death is no restart (the others went on in place): mpirun's code."""
    monkeypatch.setenv("PTEST_REPORT", NODE_DIED % "node7")
    rc, messages, _ = run_fixed(tmp_path, monkeypatch, flags, form=lost,
                                mpirun=ULFM_FIXED_MPIRUN, in_place=True)
    out, err = capfd.readouterr()
    assert rc == want, (out, err, messages)
    assert "run 0 np 4 hosts node7:2,localhost:2" in out, out
    assert any(said in m for m in messages), messages
    assert ("run 1 np 2 hosts localhost:2" in out) == (want == 0), out
    assert "run 2" not in out, out
    assert (("host node7 was lost (Open MPI lost its daemon): blacklisted for the rest of the "
             "job (Horovod's cooldown)") in messages) == (lost == "host"), messages
    lost_line = ("perseusrun: Open MPI ended the job after losing host node7 (node7: its daemon "
                 "there stopped answering; mpirun's exit code 0, the job did not finish); exit "
                 "code 69")
    assert (lost_line in err) == (want == le.HOST_LOST_EXIT), err


# Below --min-np after a shrink in place (ULFM): the ranks' decision, perseusrun's flags,
# and its restart when the ranks stop for it. The jobs: tests/mpi/test_fault_tolerance.py.
def shrunk_run(monkeypatch, min_np, persister=None, fail_sync=False):
    """hvd.elastic.run over a function that fails once (HorovodInternalError), the reset
    leaving 2 ranks, under PERSEUS_ELASTIC_MIN_NP=min_np -> (calls of the function, what
    run() ended with: its result or the exception)."""
    monkeypatch.setenv("PERSEUS_ELASTIC_MIN_NP", min_np)
    for name in ("_say_mode", "_start_persisting"):
        monkeypatch.setattr(elastic, name, lambda *args: None)
    monkeypatch.setattr(elastic.basics, "rank", lambda: 0)
    monkeypatch.setattr(elastic.basics, "size", lambda: 2)
    monkeypatch.setattr(elastic.basics, "shutdown", lambda: None)
    monkeypatch.setattr(elastic.gc, "freeze", lambda: None)  # this process goes on
    state = elastic.ObjectState(bcast_object=lambda v: v, get_rank=lambda: 0, step=3)
    state._persister = persister
    calls = []
    if fail_sync:
        def sync():  # the sync after the failure meets one more
            if calls:
                raise HorovodInternalError("another rank failed")
        state.sync = sync

    def train(state):
        calls.append(state.step)
        if len(calls) == 1:
            raise HorovodInternalError("a rank failed")
        return "done"

    try:
        return calls, elastic.run_fn(train, reset_fn=lambda: None)(state)
    except (elastic.BelowMinNpError, SystemExit) as e:
        return calls, e


class FakePersister:
    persisted = 5

    def __init__(self):
        self.done = []

    def agree(self):
        self.done.append("agree")

    def write_last(self, state):
        self.done.append("write_last")


@pytest.mark.parametrize("min_np, calls", [("", [3, 3]), ("2", [3, 3]), ("3", [3])])
def test_below_min_np_the_function_is_not_called_again(monkeypatch, capsys, min_np, calls):
    """Without --min-np, or with the survivors at it, run() calls the function again after
    the reset (as before); below it, not: where perseusrun gave no run id (nothing can add
    ranks), every rank raises BelowMinNpError naming --min-np, the size left and what to
    do, and rank 0 says it."""
    got, ended = shrunk_run(monkeypatch, min_np)
    assert got == calls
    if min_np != "3":
        assert ended == "done"
        return
    said = ("hvd.elastic.run cannot go on: 2 rank(s) left after a failure, fewer than --min-np "
            "3, and nothing can add ranks to this job")
    assert isinstance(ended, elastic.BelowMinNpError) and str(ended).startswith(said)
    assert "lower --min-np" in str(ended)
    assert "[perseus] hvd.elastic: " + said in capsys.readouterr().err


@pytest.mark.parametrize("fail_sync", [False, True])
def test_below_min_np_the_ranks_persist_and_stop_for_perseusrun(monkeypatch, capsys, fail_sync):
    """Where perseusrun can restart the job (a persister: it gave a run id), the ranks
    below --min-np take rank 0's commit and counts, persist it and leave with
    BELOW_MIN_NP_EXIT, rank 0 saying so; one more failure meanwhile still stops them (the
    commit persisted before stands)."""
    persister = FakePersister()
    got, ended = shrunk_run(monkeypatch, "3", persister, fail_sync)
    assert got == [3]
    assert isinstance(ended, SystemExit) and ended.code == elastic.BELOW_MIN_NP_EXIT == 76
    assert persister.done == ([] if fail_sync else ["agree", "write_last"])
    assert ("[perseus] hvd.elastic: 2 rank(s) left after a failure, fewer than --min-np 3: "
            "commit 5 is persisted; the ranks stop here (exit code 76)"
            in capsys.readouterr().err)


def test_perseusrun_passes_min_np_where_the_ranks_shrink(monkeypatch, tmp_path, capsys):
    """perseusrun --elastic -np 4 --min-np 3 (no host list: Horovod's elastic job on this
    machine) is accepted, and under ULFM gives the ranks PERSEUS_ELASTIC_MIN_NP; not
    without --min-np (a shrink goes on however few are left, as before), nor on a core
    without ULFM (no shrink: the restart keeps -np). (--min-np above -np is an error:
    test_bad_input_stops_perseusrun_before_any_rank.)"""
    import perseus.launcher as launcher
    monkeypatch.setattr(launcher, "check_core_mpi", lambda mpirun, flavour: None)
    argv = ["--elastic", "--dry-run", "--mpi-flavour", "openmpi", "-np", "4"]
    for ulfm, flags, passed in ((True, ["--min-np", "3"], True), (True, [], False),
                                (False, ["--min-np", "3"], False)):
        monkeypatch.setattr(launcher, "core_has_ulfm", lambda: (ulfm, "why"))
        assert main(argv + flags + ["python", "t.py"]) == 0
        out = capsys.readouterr().out
        assert ("-x PERSEUS_ELASTIC_MIN_NP=3 " in out) == passed, out


# Stands in for mpirun under ULFM: run 0's ranks stop below --min-np (exit code 76), after
# the discovery script's file ($PTEST_HOSTS) was given $PTEST_LEFT; later runs succeed.
BELOW_MIN_NP_MPIRUN = r"""
import os, sys, time
run = int(os.environ["PERSEUS_ELASTIC_RESTARTS"])
print("run %d np %s hosts %s min_np %s" % (run, sys.argv[2], sys.argv[1],
                                           os.environ.get("PERSEUS_ELASTIC_MIN_NP")), flush=True)
if run == 0:
    if os.environ.get("PTEST_LEFT"):
        open(os.environ["PTEST_HOSTS"], "w").write(os.environ["PTEST_LEFT"])
        time.sleep(0.5)  # perseusrun runs the script meanwhile (every 0.1 s here)
    sys.exit(76)
"""


@pytest.mark.parametrize("route, left, want, said", [
    ("fixed", "", 0, "run 1 np 4 hosts node7:2,localhost:2"),
    ("script", "localhost:4\n", 0, "run 1 np 4 hosts localhost:4"),
    ("script", "localhost:2\n", 1, "timed out after 0.5 s waiting for hosts (--elastic-timeout, "
     "HOROVOD_ELASTIC_TIMEOUT): the discovery script offers 2 slot(s) (localhost:2), fewer "
     "than --min-np 3"),
    ("no-ulfm", "", 76, "the job failed with exit code 76, which is neither")])
def test_perseusrun_restarts_a_job_whose_ranks_stopped_below_min_np(
        tmp_path, monkeypatch, capfd, route, left, want, said):
    """The ranks left below --min-np 3 stopped (exit code 76): on a ULFM core perseusrun
    restarts the job, fixed hosts (-H node7:2,localhost:2) or a discovery script's, once
    the hosts offer --min-np; below it, its wait (--elastic-timeout) and its failure. On
    a core without ULFM (no shrink) the code is a script's own: not restarted."""
    import perseus.launcher as launcher
    monkeypatch.setenv("PERSEUS_ELASTIC_PERSIST_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(le, "DISCOVER_PERIOD_S", 0.1)  # CI time: the loop's period
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:4\n")
    where = (["--host-discovery-script", "cat %s" % hosts] if route == "script"
             else ["-H", "node7:2,localhost:2"])
    args = launcher.make_parser().parse_args(["--elastic", "--min-np", "3"] + where + ["python"])
    args.elastic_timeout = 0.5
    first = (le.discover(args.host_discovery_script, 1) if route == "script"
             else launcher.fixed_hosts(args)[0])
    np = None if route == "script" else 4
    opts = dict(launcher.growing_options(args, {}, first, np), in_place=route == "fixed",
                grow=route == "script")
    messages = []
    env = clean_env({"PTEST_HOSTS": str(hosts), "PTEST_LEFT": left,
                     "PERSEUS_ELASTIC_MIN_NP": "3"})
    rc = le.run_growing(lambda hosts, np: [sys.executable, "-c", BELOW_MIN_NP_MPIRUN,
                                           le.describe(hosts), str(np)], env, opts,
                        say=messages.append)
    out = capfd.readouterr().out
    assert rc == want, (out, messages)
    assert ("run 1" in out) == (want == 0), out
    assert any(said in m for m in messages + [out]), (out, messages)
    if want == 0:
        assert any(m.startswith("the ranks left after a failure were fewer than --min-np 3 "
                                "and stopped at their last commit: restarting the job "
                                "(restart 1 of at most 3") for m in messages), messages
