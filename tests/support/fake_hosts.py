"""Hosts made of Linux namespaces, for multi-host runs on one machine (issue 39).

A host is a process (its holder: a shell waiting on its stdin) that owns four namespaces:
- network: `eth0` at 198.51.100.1N/24 (a documentation range no real host uses), a veth
  whose other end is a port of a bridge in a switch namespace of its own. Nothing is
  added to the machine's own network namespace: the veths are made inside the
  namespaces, which have no name, so they vanish with their last process even when the
  test process is killed;
- UTS: a hostname of its own (hostA, hostB, ...), so MPI counts separate nodes;
- mount: /etc/hosts naming every host, and a /dev/shm (tmpfs) of its own;
- IPC: SysV IPC of its own. UCX, which the mpich wheel talks through, decides that two
  processes share a machine from the boot id and the IPC namespace, not the hostname:
  with one IPC namespace per host its shared-memory transports (posix, sysv, cma) count
  the other hosts as unreachable and UCX takes TCP over eth0. (UCX_TLS is not forced.)

`ssh` in the work folder is the launcher agent: `ssh [options] HOST COMMAND...` runs
COMMAND on HOST with `/bin/sh -c` in a fresh login environment, as ssh does. MPICH's
Hydra takes it as its launcher (HYDRA_LAUNCHER=ssh, HYDRA_LAUNCHER_EXEC=<agent>, the
environment form of `-launcher ssh -launcher-exec <agent>`), Open MPI as its
plm_rsh_agent (OMPI_MCA_plm_rsh_agent=<agent>); `agent_env()` gives both.

Run as a script for a look by hand: `python tests/support/fake_hosts.py` makes hostA and hostB
and prints the agent, until Enter.
"""
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

SUBNET = "198.51.100"
TOOLS = ("ip", "unshare", "nsenter")
# What a login shell on a Debian host starts with, before the user's own settings.
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The holder of a host: its namespaces live as long as it does (and as long as any
# process started in them). It exits when the test closes its stdin, or dies.
_HOST_SETUP = r"""
set -e
hostname "$1"
mount -t tmpfs -o mode=1777,size=256m perseus-test-shm /dev/shm
mount --bind "$2" /etc/hosts
ip link set lo up
echo ready
read -r _ || true
"""
_SWITCH_SETUP = r"""
set -e
ip link set lo up
ip link add br0 type bridge
ip link set br0 up
echo ready
read -r _ || true
"""


def missing_tools():
    """What this machine lacks to make namespace hosts, as a sentence, or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return ("namespace hosts need %s (apt-get install iproute2 util-linux; "
                "scripts/setup.sh --all does)" % ", ".join(missing))
    return None


def _run(argv, what):
    res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=30)
    if res.returncode != 0:
        raise RuntimeError("%s failed (%s): %s" % (what, " ".join(argv), res.stderr.strip()))
    return res.stdout


def _start_holder(argv):
    """A holder process; returns it once its namespaces are set up."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError("could not make a namespace (%s): %s"
                           % (" ".join(argv[:6]), proc.stderr.read().strip()))
    return proc


def _netns_id(pid):
    return os.readlink("/proc/%d/ns/net" % pid)


class FakeHosts:
    """Hosts `names` (in order: .11, .12, ...) on one bridge; `folder` holds their
    files (hosts, the agent). Use as a context manager, or start() and close()."""

    def __init__(self, names, folder):
        self.names = list(names)
        self.folder = Path(folder)
        self.addresses = {name: "%s.%d" % (SUBNET, 11 + i) for i, name in enumerate(self.names)}
        self.agent = self.folder / "ssh"
        self._holders = {}
        self._switch = None

    # ------------------------------------------------------------ set up and tear down

    def start(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self):
        hosts_file = self.folder / "hosts"
        hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
            "%s %s\n" % (self.addresses[n], n) for n in self.names))
        self._switch = _start_holder(["unshare", "--net", "--", "/bin/sh", "-c", _SWITCH_SETUP])
        for name in self.names:
            self._holders[name] = _start_holder(
                ["unshare", "--net", "--uts", "--ipc", "--mount", "--propagation", "private",
                 "--", "/bin/sh", "-c", _HOST_SETUP, "holder", name, str(hosts_file)])
            self._wire(name)
        self._write_agent()

    def _wire(self, name):
        host, switch = self._holders[name].pid, self._switch.pid
        port = "to-%s" % name
        _run(["ip", "link", "add", "eth0", "netns", str(host), "type", "veth",
              "peer", "name", port, "netns", str(switch)], "making %s's veth" % name)
        self._ip(switch, "link", "set", port, "master", "br0", "up")
        self._ip(host, "addr", "add", "%s/24" % self.addresses[name], "dev", "eth0")
        self._ip(host, "link", "set", "eth0", "up")

    @staticmethod
    def _ip(pid, *args):
        return _run(["nsenter", "--target", str(pid), "--net", "ip"] + list(args),
                    "ip " + " ".join(args))

    def _write_agent(self):
        cases = "".join(
            '  %s|%s) pid=%d; ns=%s ;;\n' % (name, self.addresses[name], proc.pid,
                                              shlex.quote(_netns_id(proc.pid)))
            for name, proc in self._holders.items())
        self.agent.write_text(_AGENT % {"cases": cases, "home": shlex.quote(str(Path.home())),
                                        "path": LOGIN_PATH})
        self.agent.chmod(0o755)

    def close(self):
        """Kills what still runs on the hosts (a failed test may leave ranks behind,
        stopped ones included) and ends the holders: the namespaces and veths go with
        their last process."""
        for name in list(self._holders):
            for pid in self.pids_on(name):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        procs = list(self._holders.values()) + ([self._switch] if self._switch else [])
        for proc in procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                stream.close()
        self._holders.clear()
        self._switch = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ use

    def agent_env(self):
        """The variables that make MPICH's Hydra and Open MPI's mpirun use the agent."""
        return {"HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": str(self.agent),
                "OMPI_MCA_plm_rsh_agent": str(self.agent)}

    def command(self, host, argv, env=None, cwd=None):
        """The argv that runs `argv` on `host` through the agent, as a user who logged
        in there would: in `cwd`, with `env` set on top of the login environment."""
        line = "cd %s && exec env %s %s" % (
            shlex.quote(str(cwd or Path.home())),
            " ".join(shlex.quote("%s=%s" % kv) for kv in sorted((env or {}).items())),
            " ".join(shlex.quote(str(a)) for a in argv))
        return [str(self.agent), host, line]

    def netns(self, host):
        return _netns_id(self._holders[host].pid)

    def link(self, host, up):
        """Brings `host`'s eth0 up or down (the cable pulled at the host)."""
        self._ip(self._holders[host].pid, "link", "set", "eth0", "up" if up else "down")

    def tc(self, host, *args):
        """`tc ARGS` in `host`'s network namespace -> CompletedProcess (not checked)."""
        return subprocess.run(["nsenter", "--target", str(self._holders[host].pid), "--net", "tc"]
                              + list(args), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=30)

    def eth0_bytes(self, host):
        """(received, sent) bytes of `host`'s eth0, from its namespace's /proc/net/dev."""
        with open("/proc/%d/net/dev" % self._holders[host].pid) as f:
            for line in f:
                name, sep, fields = line.partition(":")
                if sep and name.strip() == "eth0":
                    values = fields.split()
                    return int(values[0]), int(values[8])
        raise RuntimeError("%s has no eth0" % host)

    def pids_on(self, host, match=""):
        """Processes in `host`'s network namespace (its holder left out) whose command
        line contains `match`."""
        want, holder = self.netns(host), self._holders[host].pid
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == holder:
                continue
            try:
                if os.readlink("/proc/%s/ns/net" % entry) != want:
                    continue
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if match in cmdline:
                found.append(int(entry))
        return sorted(found)


_AGENT = r"""#!/bin/sh
# ssh for the namespace hosts of tests/support/fake_hosts.py: `ssh [options] HOST COMMAND...`
# runs COMMAND on HOST (its network, hostname, mounts and IPC) with /bin/sh -c, from
# the home folder and in a fresh login environment, as ssh does. Written for one set of
# hosts: the pid of each host's holder and its network namespace, checked before use.
while [ $# -gt 0 ]; do
  case "$1" in
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;  # ssh options that take a value
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then echo "usage: ssh [options] host command..." >&2; exit 255; fi
case "$1" in
%(cases)s  *) echo "ssh: Could not resolve hostname $1: Name or service not known" >&2; exit 255 ;;
esac
shift
if [ "$(readlink /proc/$pid/ns/net)" != "$ns" ]; then
  echo "ssh: host gone (its namespaces were removed)" >&2; exit 255
fi
exec nsenter --target "$pid" --net --uts --ipc --mount -- \
  env -i HOME=%(home)s USER=root LOGNAME=root SHELL=/bin/sh PATH=%(path)s \
  /bin/sh -c "cd; $*"
"""


if __name__ == "__main__":
    reason = missing_tools() or (os.geteuid() != 0 and "namespace hosts need root")
    if reason:
        sys.exit(reason)
    with tempfile.TemporaryDirectory(prefix="perseus-hosts-") as folder, \
            FakeHosts(["hostA", "hostB"], folder) as hosts:
        print("hosts: %s\nagent: %s\nenvironment: %s" % (
            hosts.addresses, hosts.agent,
            " ".join("%s=%s" % kv for kv in hosts.agent_env().items())))
        print("e.g. %s hostA hostname; press Enter to remove them" % hosts.agent)
        sys.stdin.readline()
