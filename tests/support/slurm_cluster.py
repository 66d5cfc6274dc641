"""A one-node Slurm cluster of its own, for tests (issue 39): Debian's slurmctld,
slurmd and munged, started inside one of the namespace hosts of tests/support/fake_hosts.py
(so its ports and hostname are that host's, and nothing listens on the machine's own
network), with every file in a folder of the test's: configuration, munge key and
socket, state, spool, logs. CPUs=2, one partition. The daemons run in the foreground
as children of the test process, with SIGKILL as their parent-death signal, and are
stopped at the end (or die with the test process).

`cluster.command(argv, env)` runs a client command (srun, sbatch, squeue) on the node,
with SLURM_CONF pointing at this cluster's configuration.
"""
import os
import shutil
import subprocess
import time
from pathlib import Path

# The daemons, the client commands the tests use, and what starts the daemons.
PROGRAMS = ("slurmctld", "slurmd", "munged", "srun", "sbatch", "sinfo", "setpriv")

_CONF = """\
ClusterName=perseus-test
SlurmctldHost={node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName={node} NodeAddr={address} CPUs=2 State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def unavailable_reason():
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return ("Slurm is not installed (%s not found): apt-get install slurm-wlm munge "
                "(scripts/setup.sh --all does)" % ", ".join(missing))
    return None


class SlurmCluster:
    """Slurm on `node`, a host of `hosts` (tests/fake_hosts.FakeHosts)."""

    def __init__(self, hosts, node, folder):
        self.hosts, self.node, self.folder = hosts, node, Path(folder)
        self.conf = self.folder / "slurm.conf"
        self._daemons = []

    def start(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(mode=0o700)
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # Slurm's default ports: they are the node's own (its network namespace).
        self.conf.write_text(_CONF.format(node=self.node, address=self.hosts.addresses[self.node],
                                          folder=self.folder))
        self._daemon("munged", ["munged", "--foreground", "--force",
                                "--socket=%s/munge.socket" % self.folder,
                                "--key-file=%s" % key, "--pid-file=%s/munged.pid" % self.folder,
                                "--log-file=%s/munged.log" % self.folder,
                                "--seed-file=%s/munged.seed" % self.folder],
                     ready=lambda: (self.folder / "munge.socket").exists())
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._daemon("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait_idle()

    def _daemon(self, name, argv, ready=None):
        log = open(self.folder / ("%s.out" % name), "w")
        cmd = self.hosts.command(self.node, ["setpriv", "--pdeathsig", "KILL", "--"] + argv,
                                 {"SLURM_CONF": str(self.conf)}, cwd=self.folder)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._daemons.append((name, proc))
        deadline = time.monotonic() + 30
        while ready is not None and not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("%s did not start:\n%s" % (name, self.logs(name)))
            time.sleep(0.05)

    def _wait_idle(self):
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self._daemons:
                if proc.poll() is not None:
                    raise RuntimeError("%s exited with %d:\n%s" % (name, proc.returncode, self.logs()))
            res = self.run(["sinfo", "-h", "-n", self.node, "-o", "%T"], timeout=20)
            state = res.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.2)
        raise RuntimeError("the node is %r, not idle, after 60 s:\n%s" % (state, self.logs()))

    def logs(self, *names):
        text = []
        for path in sorted(self.folder.glob("*.out")) + sorted(self.folder.glob("*.log")):
            if names and not path.name.startswith(names):
                continue
            text.append("----- %s -----\n%s" % (path.name, path.read_text(errors="replace")[-4000:]))
        return "\n".join(text)

    def command(self, argv, env=None, cwd=None):
        """The argv that runs `argv` on the node as a user logged in there, with this
        cluster's configuration and `env`."""
        return self.hosts.command(self.node, argv, dict(env or {}, SLURM_CONF=str(self.conf)), cwd)

    def run(self, argv, env=None, cwd=None, timeout=60):
        return subprocess.run(self.command(argv, env, cwd), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def stop(self):
        """Stops the daemons (slurmd first, which ends its steps), then munged."""
        for name, proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._daemons.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
