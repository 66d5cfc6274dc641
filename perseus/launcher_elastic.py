"""perseusrun --elastic --host-discovery-script: a job that grows and shrinks with its
hosts, on any MPI (issue 46, point 3).

The route: a restart at a commit boundary. perseusrun runs the discovery script at
start and every DISCOVER_PERIOD_S while the job runs (Horovod's period); when the
hosts or slots it prints change the plan (the hosts and np the job would run on), it
writes the new generation into a notice file in the job's private persist folder.
hvd.elastic.run's rank 0 stats that file at each commit (and at check_host_updates()),
one broadcast tells every rank, and they all raise HostsUpdatedInterrupt at the same
commit: the commit just made is persisted, the ranks exit with HOSTS_UPDATED_EXIT, and
perseusrun starts the job again on the new hosts with the new np; the new job resumes
from that commit (perseus/common/elastic.py). This works on MPICH and Open MPI 4/5
alike. On a ULFM core (opts["grow"]: mpirun --with-ft ulfm --oversubscribe) the ranks
grow in place instead when the new plan adds ranks and keeps every running rank's host:
MPI_Comm_spawn from the running ranks, which keep their processes, Open MPI starting its
daemon on a new host (perseus/common/elastic_in_place.py, grow); the job goes on and
perseusrun only keeps following the hosts (a host lost counts among the job's hosts
those of the last plan told to the ranks).

perseusrun copies mpirun's output to its own as it comes and reads from it the host
of a rank that died (LOST_RANK_HOST), which it blacklists with Horovod's cooldown, and
a host whose Open MPI daemon was lost (LOST_HOST): the job is restarted without it.

The same loop runs the fixed hosts of -H/--hostfile (Horovod's FixedHosts: a discovery
that never changes). Without ULFM a rank that dies restarts the job without its host. On
a ULFM core (opts["in_place"]: mpirun --with-ft ulfm) a rank that dies is left behind by
the others in place and nothing restarts, but Open MPI 5 ends the whole job when it loses
a host's daemon: that host is blacklisted and the job restarted on the hosts left, from
the last persisted commit (hvd.elastic.run persists wherever perseusrun gives the ranks
PERSEUS_ELASTIC_RUN_ID). Where no restart can follow a lost host, perseusrun ends with
HOST_LOST_EXIT (mpirun said 0), naming the host. Under ULFM, with a script or fixed
hosts, survivors fewer than --min-np stop at their last commit with BELOW_MIN_NP_EXIT
(perseus/common/elastic.py): a restart too, once the hosts offer --min-np slots.

run_watching is perseusrun --elastic -np N on a ULFM core (shrink in place, no host
list): one run of mpirun, its output relayed the same way, only to end non-zero
(HOST_LOST_EXIT) where Open MPI 5 ended the job after losing a host and still exited
with 0.
"""

import os
import random
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time

from perseus.common.this_machine import is_this_machine as is_local

DISCOVER_PERIOD_S = 1.0       # Horovod's DISCOVER_HOSTS_FREQUENCY_SECS
ELASTIC_TIMEOUT_S = 600       # Horovod's ELASTIC_TIMEOUT_SECS (HOROVOD_ELASTIC_TIMEOUT)
DISCOVERY_TIMEOUT_S = 30      # ours: Horovod waits for a hung script for good
# Horovod's bounds of --blacklist-cooldown-range (its runner's elastic discovery module).
COOLDOWN_LOWER_BOUND_S, COOLDOWN_UPPER_BOUND_S = 1, 3600
_HOST = re.compile(r"^[A-Za-z0-9_.\-\[\]]+$")
# How mpirun names the host of a rank that died: Hydra's banner on stdout ("=   PID 123
# RUNNING AT node7"; Intel MPI's Hydra: "=   RANK 3 PID 123 RUNNING AT node7"), which
# MPICH's prints only for a rank killed by a signal, Open MPI's / PRRTE's message on
# stderr ("prterun noticed that process rank 3 with PID 123 on node node7 exited on\nsignal
# 9 (Killed)."), which it wraps: the patterns are matched on the last lines joined by
# spaces. Either report is a rank killed, whatever mpirun's exit code: MPICH 5.0's
# mpiexec, a rank on another host SIGKILLed, exited with 255 in 4 runs of 5 here, not 9
# (a proxy failing on the way out, "assert (!closed) failed":
# tests/launch/test_fault_tolerance_hosts.py).
LOST_RANK_HOST = (re.compile(r"(?:^|\s)=\s+(?:RANK \d+ )?PID \d+ RUNNING AT (\S+)"),
                  re.compile(r"noticed that process rank \d+ with PID \d+ on node (\S+) "
                             r"exited on signal"))
# How Open MPI 5's runtime (PRRTE 3.0) says it lost a host's daemon, after which it ends
# the whole job, ULFM or not, and mpirun still exits with 0 (docs/elastic.md, "A host
# lost"): its errmgr's help text when the daemon's connection fails ("Remote daemon:
# [prterun-hostA-1@0,1] on node hostB") and plm/ssh's when the daemon's ssh session ends
# ("Remote host:   hostB"). Each is a block of lines: matched on the last LOST_HOST_LINES
# joined by spaces, once a line names the remote end. (what happened there, pattern).
LOST_HOST = (("its daemon there stopped answering",
              re.compile(r"PRTE has lost communication with a remote daemon\..*?"
                         r"Remote daemon\s*:\s*\S+ on node (\S+)")),
             ("its daemon there failed to report back",
              re.compile(r"A daemon failed to report back after being spawned\..*?"
                         r"Remote host:\s*(\S+)")))
LOST_HOST_LINES = 16
# How PRRTE says its own state machine failed, after which it kills the job's processes
# and mpirun exits with 0 all the same (5 runs of 8 where new ranks were spawned onto
# another host while ranks that had left in a shrink in place were not yet reaped:
# "UNSUPPORTED DAEMON ERROR STATE: NO PATH TO TARGET"): the job did not finish.
RUNTIME_FAILED = re.compile(r"UNSUPPORTED DAEMON ERROR STATE: (.+)")
# How MPICH's Hydra says it lost the proxy of a host lost whole (its ranks and the proxy
# killed, the host down): the proxy's control connection closed. It names no host, so
# perseusrun asks each host whether it answers (silent_hosts).
HYDRA_PROXY_LOST = re.compile(r"control_cb \(.*\): assert \(!closed\) failed")
# How long a host has to answer the launch agent after Hydra lost a proxy.
PROBE_TIMEOUT_S = 10
# perseusrun's exit code when Open MPI ended the job after losing a host and mpirun
# exited with 0 (EX_UNAVAILABLE, BSD's exit code for "a service is unavailable"): a
# scheduler must not take the job for finished. mpirun's own code is kept where not 0.
HOST_LOST_EXIT = 69


class DiscoveryError(Exception):
    """The discovery script failed, hung, or printed what is not host[:slots] lines."""


def parse_discovered(text, default_slots, script="the discovery script"):
    """The script's output -> [(host, slots)] in its order. A line is `host` (with
    default_slots, --slots-per-host) or `host:slots`; empty lines are skipped (no host
    yet, as Horovod allows). A malformed line or a host named twice is an error."""
    hosts, seen = [], set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        name, sep, slots = line.rpartition(":")
        if not sep:
            name, slots = line, None
        if not _HOST.match(name) or (slots is not None and not slots.isdigit()):
            raise DiscoveryError("%s printed %r on line %d: expected host or host:slots"
                                 % (script, raw, number))
        count = default_slots if slots is None else int(slots)
        if count < 1:
            raise DiscoveryError("%s printed %r on line %d: a host needs at least one slot"
                                 % (script, raw, number))
        if name in seen:
            raise DiscoveryError("%s named host %s twice (line %d): each host once, with "
                                 "its slots" % (script, name, number))
        seen.add(name)
        hosts.append((name, count))
    return hosts


def discover(script, default_slots, timeout=DISCOVERY_TIMEOUT_S):
    """Runs the discovery script (a shell command, as Horovod runs it) -> [(host, slots)].
    DiscoveryError when it exits non-zero, runs past `timeout` s or prints garbage."""
    proc = subprocess.Popen(script, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        raise DiscoveryError("the host discovery script %r did not finish within %g s "
                             "(PERSEUS_HOST_DISCOVERY_TIMEOUT)" % (script, timeout))
    if proc.returncode != 0:
        raise DiscoveryError("the host discovery script %r failed with exit code %d%s"
                             % (script, proc.returncode,
                                (": " + err.strip().splitlines()[-1]) if err.strip() else ""))
    return parse_discovered(out, default_slots, "the host discovery script %r" % script)


class Blacklist:
    """Hosts that lost a rank, as Horovod's HostState: without a cooldown range a host
    stays out for the rest of the job; with --blacklist-cooldown-range MIN MAX its n-th
    blacklisting keeps it out for MIN * 2**n + uniform(0, 1) * MIN seconds, clamped to
    [MIN, MAX]. Hosts of this machine are never blacklisted (the slot of a killed
    process is free again at once, and there is no other host to go to)."""

    def __init__(self, cooldown_range=None, clock=time.time, uniform=random.random):
        self.range = cooldown_range
        self.clock, self.uniform = clock, uniform
        self.count, self.until = {}, {}

    def add(self, host):
        if is_local(host):
            return None
        self.count[host] = self.count.get(host, 0) + 1
        if self.range is None:
            self.until[host] = float("inf")
        else:
            low, high = self.range
            delay = low * (1 << self.count[host]) + self.uniform() * low
            self.until[host] = self.clock() + max(low, min(high, delay))
        return self.until[host]

    def blocked(self, host):
        return self.until.get(host, 0) > self.clock()

    def forever(self, host):
        """Whether `host` is out for the rest of the job (no cooldown range)."""
        return self.until.get(host, 0) == float("inf")

    def describe(self, hosts):
        """'node7 (for 3 s more), node8 (for the rest of the job)': those of `hosts`
        [(host, slots)] blacklisted now, or ''."""
        now = self.clock()
        return ", ".join("%s (%s)" % (h, "for the rest of the job" if self.forever(h)
                                      else "for %.0f s more" % (self.until[h] - now))
                         for h, _ in hosts if self.blocked(h))


def plan(found, order, blacklist, min_np, max_np):
    """(hosts [(host, slots)], np) to run on, or None below min_np. The hosts keep the
    order of the last run (`order`, so rank 0 stays on its host, as Horovod keeps the
    oldest hosts first), then new ones in the script's order; blacklisted hosts are
    left out; np is min(max_np, the slots), and only hosts that get a rank are kept."""
    slots = {h: n for h, n in found if not blacklist.blocked(h)}
    names = [h for h in order if h in slots] + [h for h, _ in found
                                                 if h in slots and h not in order]
    total = sum(slots.values())
    if total < min_np or total == 0:
        return None
    np = min(max_np, total) if max_np else total
    hosts, left = [], np
    for name in names:
        if left <= 0:
            break
        hosts.append((name, slots[name]))
        left -= slots[name]
    return hosts, np


class _Relay(threading.Thread):
    """Copies one of mpirun's output streams to ours as it comes, and notes into `job`
    (a Relayed) the hosts mpirun says lost a rank (LOST_RANK_HOST, into `lost`), those
    whose daemon it lost (LOST_HOST, (host, what happened) into `hosts_lost`), what its
    runtime said of its own failure (RUNTIME_FAILED, into `runtime_failed`), and Hydra's
    word that it lost a host's proxy (HYDRA_PROXY_LOST, into `proxy_lost`)."""

    def __init__(self, pipe, fd, job):
        super().__init__(daemon=True)
        self.pipe, self.fd, self.job, self.partial = pipe, fd, job, b""
        self.recent, self.block = [], []

    def run(self):
        while True:
            chunk = os.read(self.pipe.fileno(), 65536)
            if not chunk:
                break
            _write_all(self.fd, chunk)
            lines = (self.partial + chunk).split(b"\n")
            self.partial = lines.pop()[-4096:]
            for line in lines:
                self.scan(line)
        self.scan(self.partial)
        self.pipe.close()

    def scan(self, line):
        line = line.decode(errors="replace").strip()
        self.recent = (self.recent + [line])[-3:]
        text = " ".join(self.recent)
        for pattern in LOST_RANK_HOST:
            m = pattern.search(text)
            if m:
                self.job.lost.append(m.group(1))
                self.recent = []  # each report once
        m = RUNTIME_FAILED.search(line)
        if m:
            self.job.runtime_failed.append(m.group(1).strip())
        if HYDRA_PROXY_LOST.search(line):
            self.job.proxy_lost.append(line)
        self.block = (self.block + [line])[-LOST_HOST_LINES:]
        if "Remote " in line:  # the line that ends a LOST_HOST report: only then match
            text = " ".join(self.block)
            for what, pattern in LOST_HOST:
                m = pattern.search(text)
                if m:
                    self.job.hosts_lost.append((m.group(1), what))
                    self.block = []


class Relayed:
    """mpirun as perseusrun's child: its output copied to ours unchanged as it comes
    (_Relay), what it reports noted (lost: hosts that lost a rank; hosts_lost: (host,
    what happened) for hosts whose daemon Open MPI lost; runtime_failed: what Open MPI's
    runtime said of its own failure; proxy_lost: Hydra's lines saying it lost a host's
    proxy), and SIGTERM to it should perseusrun die (end_with_parent), as an exec'd
    mpirun would have died with it."""

    def __init__(self, cmd, env):
        self.lost, self.hosts_lost, self.runtime_failed, self.proxy_lost = [], [], [], []
        self.child = subprocess.Popen(cmd, env=env, preexec_fn=end_with_parent,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.relays = [_Relay(pipe, fd, self)
                       for pipe, fd in ((self.child.stdout, 1), (self.child.stderr, 2))]
        for relay in self.relays:
            relay.start()

    def wait(self, timeout=None):
        """mpirun's exit code once it and its output ended (subprocess.TimeoutExpired
        past `timeout`)."""
        returncode = self.child.wait(timeout=timeout)
        for relay in self.relays:  # bounded: a stray process may hold mpirun's pipes open
            relay.join(timeout=10)
        return returncode

    def code(self, returncode):
        """perseusrun's exit code for mpirun's `returncode`: HOST_LOST_EXIT where mpirun
        said 0 but Open MPI ended the job (a host lost, its runtime failed)."""
        return exit_code(returncode) or (
            HOST_LOST_EXIT if self.hosts_lost or self.runtime_failed else 0)


class Forwarding:
    """While in it, SIGINT, SIGTERM and SIGHUP to perseusrun go to `.child` (mpirun), as
    they would reach an exec'd mpirun; `.signal` says which came last (None: none)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.signal, self.child, self.previous = None, None, {}

    def forward(self, signum, frame):
        self.signal = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.forward) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def exit_code(returncode):
    """perseusrun's exit code for mpirun's: a signal's death as a shell says it (128 + N),
    the rest as it is."""
    return 128 - returncode if returncode < 0 else returncode


def host_lost_line(hosts_lost, returncode, code):
    """The line perseusrun prints when mpirun reported lost hosts: (host, what) pairs."""
    named = dict.fromkeys(hosts_lost)  # in order, once each
    return ("Open MPI ended the job after losing host%s %s (%s; mpirun's exit code %d%s); "
            "exit code %d" % ("s" if len({h for h, _ in named}) > 1 else "",
                              ", ".join(dict.fromkeys(h for h, _ in named)),
                              "; ".join("%s: %s" % pair for pair in named), returncode,
                              ", the job did not finish" if returncode == 0 else "", code))


def runtime_failed_line(runtime_failed, returncode, code):
    """The line perseusrun prints when Open MPI's runtime said it failed."""
    return ("Open MPI's runtime failed and ended the job (%s; mpirun's exit code %d%s); "
            "exit code %d" % ("; ".join(dict.fromkeys(runtime_failed)), returncode,
                              ", the job did not finish" if returncode == 0 else "", code))


def run_watching(cmd, env, say=None):
    """perseusrun --elastic on a ULFM core: runs cmd (mpirun --with-ft ulfm) as a child
    instead of exec'ing it -> perseusrun's exit code: mpirun's, but HOST_LOST_EXIT where
    mpirun reported a lost host (LOST_HOST) and exited with 0, as Open MPI 5 does after
    ending the whole job for it. Signals to perseusrun go to mpirun."""
    say = say or (lambda text: print("perseusrun: " + text, file=sys.stderr, flush=True))
    with Forwarding() as stop:
        job = Relayed(cmd, env)
        stop.child = job.child
        returncode = job.wait()
    code = job.code(returncode)
    if job.hosts_lost:
        say(host_lost_line(job.hosts_lost, returncode, code))
    elif job.runtime_failed:
        say(runtime_failed_line(job.runtime_failed, returncode, code))
    return code


def _write_all(fd, data):
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:
            return


def host_named(reported, hosts):
    """The host of `hosts` that mpirun's name for it means (the same name, or the same
    first label: node7 for node7.cluster), or None."""
    names = [h for h, _ in hosts]
    if reported in names:
        return reported
    short = reported.split(".")[0]
    same = [h for h in names if h.split(".")[0] == short]
    return same[0] if len(same) == 1 else None


# How a rank that was preempted, killed or crashed ends: the signals whose death makes
# perseusrun --elastic restart the job. Hydra's mpirun exits with the signal's number,
# Open MPI's and a shell's with 128 + it.
DEATH_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGBUS,
                 signal.SIGABRT, signal.SIGILL, signal.SIGFPE)


def hydra_agent(env):
    """The program Hydra launches its proxies with: HYDRA_LAUNCHER_EXEC, else ssh (rsh)."""
    return env.get("HYDRA_LAUNCHER_EXEC") or env.get("HYDRA_LAUNCHER", "ssh")


def silent_hosts(hosts, env):
    """Of `hosts` (names), those other than this machine that do not answer Hydra's launch
    agent within PROBE_TIMEOUT_S (`<agent> [HYDRA_LAUNCHER_EXTRA_ARGS] HOST true`, the
    agent HYDRA_LAUNCHER_EXEC, else ssh), all asked at once; none where Hydra launches
    another way (HYDRA_LAUNCHER other than ssh or rsh: Slurm, a resource manager)."""
    if env.get("HYDRA_LAUNCHER", "ssh") not in ("ssh", "rsh"):
        return []
    agent = [hydra_agent(env)] + shlex.split(env.get("HYDRA_LAUNCHER_EXTRA_ARGS", ""))
    probes = {}
    for host in dict.fromkeys(hosts):
        if not is_local(host):
            probes[host] = subprocess.Popen(agent + [host, "true"], env=env,
                                            stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
    deadline, silent = time.monotonic() + PROBE_TIMEOUT_S, []
    for host, probe in probes.items():
        try:
            answered = probe.wait(timeout=max(0.1, deadline - time.monotonic())) == 0
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.wait()
            answered = False
        if not answered:
            silent.append(host)
    return silent


def died_of_signal(returncode):
    """Whether mpirun's exit code says a rank was killed by one of DEATH_SIGNALS (and
    not that a rank's script failed: exit code 1, or that mpirun itself was signalled:
    negative)."""
    return returncode > 0 and (returncode in DEATH_SIGNALS or
                               returncode - 128 in DEATH_SIGNALS)


def end_with_parent():
    """In mpirun before its exec (Linux): SIGTERM when perseusrun dies, as an exec'd
    mpirun would have died with it; mpirun then ends its ranks."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def describe(hosts):
    return ",".join("%s:%d" % h for h in hosts)


def write_notice(path, generation, hosts, np, daemons=()):
    """The ranks' channel: `generation np hosts daemons`, replaced atomically. daemons:
    the hosts other than this machine where the running mpirun may have started its
    daemon (those of its start and of every notice since; "-" for none), which a grow
    in place onto a new host needs to know (elastic_in_place.decide)."""
    tmp = "%s.%s.tmp" % (path, secrets.token_hex(4))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("%d %d %s %s\n" % (generation, np, describe(hosts),
                                    ",".join(sorted(daemons)) or "-"))
    os.replace(tmp, path)


def remote_hosts(hosts):
    """The hosts of [(host, slots)] that are not this machine."""
    return {host for host, _ in hosts if not is_local(host)}


def run_growing(start_command, env, opts, say=None):
    """Runs the job under a discovery script, or on fixed hosts; -> the last exit code.

    start_command(hosts, np) -> mpirun's argv. opts: script (None: the fixed hosts of
    -H/--hostfile, `first`, a discovery that never changes, as Horovod's FixedHosts),
    slots (default slots a host), min_np, max_np (0: no bound), elastic_timeout,
    discovery_timeout, cooldown_range, limit (--reset-limit: restarts for deaths and host
    changes alike, as Horovod counts resets), first (the hosts found at start), in_place
    (fixed hosts on a ULFM core, mpirun --with-ft ulfm: a rank that dies is left behind by
    the others, so only a host Open MPI lost whole, which ends the job, or a host back
    from its cooldown restarts it).

    Where a lost host ended the job and it cannot start again (--reset-limit, or the hosts
    left below --min-np), the exit code is that run's (HOST_LOST_EXIT where mpirun said 0),
    with host_lost_line: never 0, nor a code that hides the lost host."""
    from perseus.common import elastic, private_files
    say = say or (lambda text: print("perseusrun: --elastic: " + text, file=sys.stderr,
                                     flush=True))
    run_id = "%d-%s" % (os.getpid(), secrets.token_hex(6))
    folder = elastic.persist_dir()
    private_files.private_folder(folder)
    notice = elastic.notice_path(folder, run_id)
    blacklist = Blacklist(opts["cooldown_range"])
    stop = Forwarding().__enter__()

    script = opts["script"]
    source = ("the discovery script offers" if script else
              "the hosts of -H/--hostfile offer")

    def find():
        if not script:
            return list(opts["first"])
        return discover(script, opts["slots"], opts["discovery_timeout"])

    # The ranks watch the notice (a stat and a broadcast at each commit) only where the
    # plan can change while they run: a script's hosts, or a fixed host back from its
    # cooldown (Horovod counts it as added); fixed hosts without a cooldown range never.
    watch = bool(script) or opts["cooldown_range"] is not None

    def leave_out(reported, hosts, what):
        """Blacklists the host of `hosts` mpirun named `reported`, saying so."""
        host = host_named(reported, hosts)
        until = None if host is None else blacklist.add(host)  # None: this machine
        if until is None:
            say("host %s %s: not blacklisted (%s)" % (
                reported, what, "this machine" if host is not None or is_local(reported)
                else "not one of the job's hosts"))
            return
        say("host %s %s: blacklisted %s (Horovod's cooldown)" % (
            host, what, "for the rest of the job" if until == float("inf")
            else "for %.0f s" % (until - time.time())))

    def give_up(code_before):
        """The exit code when the job cannot start (again): `code_before` (1), but that of
        the last run where a lost host ended it, saying so."""
        if last is None or not last.hosts_lost:
            return code_before
        print("perseusrun: " + host_lost_line(last.hosts_lost, last_returncode, last_code),
              file=sys.stderr, flush=True)
        return last_code

    order, found, generation, restarts = [], opts["first"], 0, 0
    last = last_returncode = last_code = None  # the run that ended last
    try:
        while True:
            deadline = time.monotonic() + opts["elastic_timeout"]
            # As Horovod's driver: the first start waits for -np slots, later ones for
            # --min-np.
            need = opts.get("start_np") or opts["min_np"] if restarts == 0 else opts["min_np"]
            need = max(need, opts["min_np"])
            chosen = plan(found, order, blacklist, need, opts["max_np"])
            waiting = False
            while chosen is None:
                short = "%s %d slot(s) (%s%s), fewer than %s" % (
                    source, sum(n for h, n in found if not blacklist.blocked(h)),
                    describe(found) or "no host",
                    "; blacklisted: " + blacklist.describe(found)
                    if blacklist.describe(found) else "",
                    "--min-np %d" % need if need == opts["min_np"] else
                    "-np %d (the first start waits for -np)" % need)
                if not script and sum(n for h, n in found if not blacklist.forever(h)) < need:
                    # Fixed hosts: only a cooldown could bring slots back, and none will
                    # (Horovod would wait out the elastic timeout all the same).
                    say("%s, and no wait can bring enough back (a host blacklisted without "
                        "--blacklist-cooldown-range stays out for the rest of the job): "
                        "giving up" % short)
                    return give_up(1)
                if time.monotonic() >= deadline:
                    say("timed out after %g s waiting for hosts (--elastic-timeout, "
                        "HOROVOD_ELASTIC_TIMEOUT): %s" % (opts["elastic_timeout"], short))
                    return give_up(1)
                if not waiting:
                    waiting = True
                    say("%s: waiting up to %g s for hosts (--elastic-timeout, "
                        "HOROVOD_ELASTIC_TIMEOUT)" % (short, opts["elastic_timeout"]))
                if stop.signal is not None:
                    give_up(None)  # the line, should a lost host have ended the last run
                    return 128 + stop.signal
                time.sleep(DISCOVER_PERIOD_S)
                try:
                    found = find()
                except DiscoveryError as e:
                    say("%s (trying again)" % e)
                chosen = plan(found, order, blacklist, need, opts["max_np"])
            hosts, np = chosen
            order = [h for h, _ in hosts]
            daemons = remote_hosts(hosts)
            write_notice(notice, generation, hosts, np, daemons)
            started = generation
            say("starting %d rank(s) on %s (run %d)" % (np, describe(hosts), restarts))
            child_env = dict(env, PERSEUS_ELASTIC_RUN_ID=run_id,
                             PERSEUS_ELASTIC_RESTARTS=str(restarts),
                             PERSEUS_ELASTIC_RESET_LIMIT=str(opts["limit"]),
                             PERSEUS_ELASTIC_NOTICE=notice if watch else "",
                             PERSEUS_ELASTIC_GENERATION=str(generation),
                             PERSEUS_ELASTIC_GROW="1" if opts.get("grow") else "")
            job = Relayed(start_command(hosts, np), child_env)
            stop.child = job.child
            told = chosen
            while True:
                try:
                    returncode = job.wait(timeout=DISCOVER_PERIOD_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                try:
                    now = find()
                except DiscoveryError as e:  # transient while the job runs, as Horovod
                    say("%s (the job goes on)" % e)
                    continue
                found = now
                wanted = plan(found, order, blacklist, opts["min_np"], opts["max_np"])
                if wanted is not None and wanted != told:
                    generation += 1
                    told = wanted
                    write_notice(notice, generation, *wanted, daemons)
                    daemons |= remote_hosts(wanted[0])
                    say("the hosts changed: %d rank(s) on %s next; the ranks are told "
                        "(HostsUpdatedInterrupt at their next commit%s)"
                        % (wanted[1], describe(wanted[0]),
                           ", where the job is resized in place where it can be"
                           if opts.get("grow") else ""))
            # Open MPI 5 ends the job after losing a host with exit code 0: not done.
            code = job.code(returncode)
            last, last_returncode, last_code = job, returncode, code
            if code == 0:
                for path in (notice, elastic.persist_path(folder, run_id)):
                    if os.path.isfile(path) and not os.path.islink(path):
                        os.unlink(path)
                return 0
            if stop.signal is not None:
                if job.hosts_lost:
                    print("perseusrun: " + host_lost_line(job.hosts_lost, returncode, code),
                          file=sys.stderr, flush=True)
                return code
            # The job's hosts: those it started on, and those of the last plan the ranks
            # were told, where a grow in place may have taken it (or failed to).
            reached = hosts + [h for h in told[0] if h not in hosts]
            if job.hosts_lost:  # a host lost is a host failure, whatever mpirun's code
                why = host_lost_line(job.hosts_lost, returncode, code).partition(" (")[0]
                for reported in dict.fromkeys(h for h, _ in job.hosts_lost):
                    leave_out(reported, reached, "was lost (Open MPI lost its daemon)")
            elif job.runtime_failed:  # no host to blacklist: the same hosts again
                why = runtime_failed_line(job.runtime_failed, returncode, code).partition(
                    " (")[0]
            elif returncode == elastic.HOSTS_UPDATED_EXIT and generation > started:
                why = "the ranks stopped at a commit for the new hosts"
            elif returncode == elastic.BELOW_MIN_NP_EXIT and (opts.get("in_place")
                                                              or opts.get("grow")):
                # Under ULFM: the survivors of a shrink in place, fewer than --min-np,
                # stopped at their last commit (persisted) for a restart on --min-np slots.
                why = ("the ranks left after a failure were fewer than --min-np %d and "
                       "stopped at their last commit" % opts["min_np"])
                for reported in dict.fromkeys(job.lost):  # the hosts mpirun's output names
                    leave_out(reported, reached, "lost a rank")
            elif returncode == elastic.GROWN_JOB_FAILED_EXIT and opts.get("grow"):
                # A rank of a job grown in place failed: Open MPI 5 does not outlive a
                # spawned process's death, so the ranks stopped at their last commit.
                why = ("a rank failed after the job grew in place, which Open MPI does not "
                       "outlive: the ranks stopped at their last commit")
                for reported in dict.fromkeys(job.lost):  # the hosts mpirun's output names
                    leave_out(reported, reached, "lost a rank")
            elif (died_of_signal(returncode) or job.lost) and not opts.get("in_place"):
                why = "a rank was killed (mpirun's exit code %d)" % returncode
                for reported in dict.fromkeys(job.lost):  # the hosts mpirun's output names
                    leave_out(reported, reached, "lost a rank")
            elif job.proxy_lost and not opts.get("in_place"):
                # MPICH's Hydra lost a host whole and names none: the hosts that do not
                # answer are left out; where all answer, the same hosts again.
                silent = silent_hosts([h for h, _ in reached], env)
                for host in silent:
                    leave_out(host, reached, "does not answer (%s %s true) after Hydra lost "
                              "a host's proxy" % (hydra_agent(env), host))
                why = "Hydra lost a host's proxy, naming no host (%s)" % (
                    "%s did not answer" % ",".join(silent) if silent else
                    "every host answers: the same hosts again")
            elif opts.get("in_place"):
                say("the job failed with exit code %d, and no host was lost: not restarted "
                    "(under ULFM a rank that dies is left behind in place; only a host Open "
                    "MPI loses whole restarts the job)" % returncode)
                return code
            else:
                say("the job failed with exit code %d, which is neither a rank killed by a "
                    "signal nor the ranks stopping for new hosts: not restarted" % returncode)
                return code
            if restarts >= opts["limit"]:
                say("%s and the job was already restarted %d time(s), the --reset-limit: "
                    "giving up" % (why, restarts))
                if job.hosts_lost:
                    print("perseusrun: " + host_lost_line(job.hosts_lost, returncode, code),
                          file=sys.stderr, flush=True)
                return code
            restarts += 1
            say("%s: restarting the job (restart %d of at most %d, --reset-limit), which "
                "resumes from its last persisted commit" % (why, restarts, opts["limit"]))
    finally:
        stop.__exit__()
        if os.path.isfile(notice) and not os.path.islink(notice):
            os.unlink(notice)  # of no use once perseusrun ends (the commit may be)

