"""Resizing a running job in place (issue 46, point 3), for hvd.elastic.run
(perseus/common/elastic.py) on a ULFM core under perseusrun --elastic
--host-discovery-script: at a HostsUpdatedInterrupt, whether the notice's change can be
made in place (decide: a grow that keeps every old rank's host, a shrink that only
takes ranks away), and making it (grow: the core spawns the new ranks and merges them;
shrink: the core splits the job and the ranks that leave end). Any other change takes
the restart, which elastic.py runs; so does the persister's part (elastic.py's
_join_grown_job, which every rank runs after either). The exit code the core leaves a
failed resize with is elastic.HOSTS_UPDATED_EXIT's (75)."""

import os
import shutil
import socket
import sys
import time

from perseus.common import basics, launch_check
from perseus.common.this_machine import is_this_machine


def spawn_command():
    """This process's command line (/proc/self/cmdline), the program as a path: what the
    new ranks of a grow in place run."""
    with open("/proc/self/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0")[:-1]]
    program = argv[0]
    if os.sep not in program:
        program = shutil.which(program) or sys.executable
    return os.path.abspath(program), argv[1:]


def my_host(hosts):
    """The host of the notice's [(host, slots)] that is this machine, or None: its own
    name before a name every machine answers to (localhost)."""
    mine = [h for h, _ in hosts if is_this_machine(h)]
    named = [h for h in mine if h in (socket.gethostname(), socket.getfqdn())]
    return (named or mine or [None])[0]


def grow_places(np, hosts, machines):
    """Where a grow in place puts its new ranks: np and hosts [(host, slots)] of the
    notice, machines the notice's host of each rank now (None: its host is not in it).
    perseusrun's plan fills the hosts in order (launcher_elastic.plan); the old ranks
    stay where they run. -> ([(host, new ranks)] in rank order, None), or (None, why)."""
    if np <= len(machines):
        return None, "%d rank(s) asked for, %d running" % (np, len(machines))
    missing = [rank for rank, host in enumerate(machines) if host is None]
    if missing:
        return None, "the host of rank(s) %s is not among the new hosts" % (
            ",".join(map(str, missing)))
    places, left = [], np
    running = {host: machines.count(host) for host in machines}
    for host, slots in hosts:
        wanted = min(slots, left)
        left -= wanted
        more = wanted - running.pop(host, 0)
        if more < 0:
            return None, "host %s would run %d rank(s), fewer than now" % (host, wanted)
        if more:
            places.append((host, more))
    if running:
        return None, "host(s) %s would run no rank" % ",".join(sorted(running))
    return places, None


def shrink_keeps(np, hosts, machines, spawned):
    """Which ranks a shrink in place keeps: np and hosts [(host, slots)] of the notice,
    machines the notice's host of each rank now (None: its host is not in it), spawned
    whether each was started by a grow. Each host keeps its lowest ranks, as many as
    perseusrun's plan gives it (filled in order: launcher_elastic.plan). -> ([keep, ...]
    a rank, None), or (None, why) where the plan needs ranks on a host that has fewer
    now (a grow too), or where a rank started by a grow would leave: Open MPI 5.0.11
    ends the whole job when a process of a spawned job ends without MPI_Finalize (it
    does not make that job fault tolerant: docs/investigations/grow-in-place.md), and
    its MPI_Finalize would wait for the job's end. Those take the restart."""
    wanted, left = {}, np
    for host, slots in hosts:
        wanted[host] = min(slots, left)
        left -= wanted[host]
    keeps = []
    for host in machines:
        keep = host is not None and wanted.get(host, 0) > 0
        if keep:
            wanted[host] -= 1
        keeps.append(keep)
    short = ["%s:%d" % (host, n) for host, n in wanted.items() if n > 0]
    if short:
        return None, "the new hosts want more ranks than run there now (%s more)" % (
            ",".join(short))
    grown = [str(rank) for rank, keep in enumerate(keeps) if spawned[rank] and not keep]
    if grown:
        return None, ("rank(s) %s would leave, started by a grow: Open MPI ends the job when "
                      "such a process leaves it" % ",".join(grown))
    return keeps, None


def decide(state, watch):
    """At a HostsUpdatedInterrupt, on every rank: (ranks to add, None) for a grow in place
    on the one machine the job runs on (MPI's choice of place), (ranks to add, ("host:n,..."
    of the new ranks, "host:slots,..." of the hosts to add)) for one that places them,
    (minus the ranks that leave, whether this one stays) for a shrink in place, or (0,
    None) for the restart. Rank 0 reads the notice; one broadcast tells all, one
    allgather says where each rank runs; rank 0 says why a change in place is not taken."""
    notice = None
    if basics.rank() == 0 and watch is not None:
        notice = watch.read()
    notice = state._bcast_object(notice)
    if notice is None or notice[1] == basics.size():
        return 0, None
    from perseus.common.objects import allgather_object
    generation, np, hosts = notice
    machines, spawned = zip(*allgather_object((my_host(hosts), basics.joined_job())))
    machines = list(machines)
    if np < basics.size():
        keeps, why = shrink_keeps(np, hosts, machines, spawned)
        places = None
    else:
        places, why = grow_places(np, hosts, machines)
    if why is not None:
        if basics.rank() == 0:
            sys.stderr.write("[perseus] hvd.elastic: the hosts changed: not %s in place "
                             "(%s)\n" % ("shrunk" if np < basics.size() else "grown", why))
            sys.stderr.flush()
        return 0, None
    if watch is not None:
        watch.generation = generation
    if np < basics.size():
        return np - basics.size(), keeps[basics.rank()]
    machines = set(machines)
    if all(host in machines for host, _ in places) and len(machines) == 1:
        return np - basics.size(), None  # all on the one machine the job runs on
    # Hosts no rank runs on yet join the job's with their slots (Open MPI starts its
    # daemon there); every new rank is placed on its host.
    slots = dict(hosts)
    return np - basics.size(), (",".join("%s:%d" % place for place in places),
                                ",".join("%s:%d" % (host, slots[host]) for host, _ in places
                                         if host not in machines))


# What a running job's process manager sets in its processes (PRRTE's own among them)
# and what names the process's host or shell: not given to new ranks on another host.
_NOT_SPAWNED_ENV = launch_check.LAUNCHER_STATE_PREFIXES + ("PRTE_", "OPAL_")
_NOT_SPAWNED_NAMES = ("HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_")


def with_environment(program, args):
    """(program, args) that run `program args` with the variables perseusrun gave this
    process (PERSEUS_SPAWN_ENV names them: `env NAME=value ... program args`): Open MPI
    gives a process it spawns on another host only that host's login environment and its
    own variables, not mpirun's -x (tried: docs/investigations/grow-in-place.md), and an
    MPI info value (PMIX_ENVAR) holds at most 255 characters. Only those: the command line
    can be seen on the new host, and the rest of this process's environment (a token, a
    key) was never meant to leave this host. Without PERSEUS_SPAWN_ENV (not perseusrun),
    this process's environment less its launcher's state."""
    listed = os.environ.get("PERSEUS_SPAWN_ENV")
    names = [n for n in listed.split(",") if n in os.environ] if listed else sorted(os.environ)
    assignments = ["%s=%s" % (name, os.environ[name]) for name in sorted(names)
                   if not name.startswith(_NOT_SPAWNED_ENV) and name not in _NOT_SPAWNED_NAMES]
    return shutil.which("env") or "/usr/bin/env", assignments + [program] + list(args)


def grow(state, add, places):
    """Adds `add` ranks to the running job (`places`: decide's): shutdown, then
    init() spawns them (this process's command line, same folder; with places, on the
    hosts named, the new hosts added to the job, under this process's environment) and
    merges them after the old ranks; the new
    ranks' run() joins the steps that follow here (elastic._join_grown_job, which the
    caller runs next). Should a process,
    old or new, end during the spawn or the merge, the others leave from inside init()
    with HOSTS_UPDATED_EXIT, at once or at the peer timeout, and perseusrun starts the
    job on the new hosts from the commit persisted here (the restart route)."""
    before, started = basics.size(), time.monotonic()
    program, args = spawn_command()
    # A process that ends during the grow makes every other leave it (the core, with
    # HOSTS_UPDATED_EXIT): perseusrun then restarts the job from this commit.
    state._persister.write_last(state)
    basics.shutdown()
    from perseus.common import library
    hosts = add_hosts = None
    if places is not None:  # placed on the hosts named, some not this machine
        hosts, add_hosts = places
        program, args = with_environment(program, args)
    library.check(library.perseus_grow(add, program.encode(),
                                       b"".join(a.encode() + b"\0" for a in args), len(args),
                                       os.getcwd().encode(),
                                       hosts.encode() if hosts else None,
                                       add_hosts.encode() if add_hosts else None))
    basics.init()
    if basics.rank() == 0:
        sys.stderr.write("[perseus] hvd.elastic: the hosts changed: grew in place from %d to %d "
                         "rank(s) in %.1f s; the new ranks get rank 0's state\n"
                         % (before, basics.size(), time.monotonic() - started))
        sys.stderr.flush()


def shrink(state, keep):
    """Ends this rank's part in the job unless `keep` (decide's), every rank
    together: shutdown, then the core splits the job's processes (perseus_keep_in_job);
    the ranks that leave end their process at once (exit code 0: no MPI_Finalize, which
    would wait for the job's end; Python's atexit hooks do not run), and the others
    form their world in their rank order, the old rank 0 first, with the commit just
    made (persisted first: should a process end during the split, the others leave with
    HOSTS_UPDATED_EXIT and perseusrun restarts the job from it)."""
    before, rank, started = basics.size(), basics.rank(), time.monotonic()
    state._persister.write_last(state)
    basics.shutdown()
    from perseus.common import library
    library.check(library.perseus_keep_in_job(1 if keep else 0))
    if not keep:
        sys.stderr.write("[perseus] hvd.elastic: the hosts changed: rank %d of %d leaves the "
                         "job (its slot is gone); the others go on in place\n" % (rank, before))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    basics.init()
    if basics.rank() == 0:
        sys.stderr.write("[perseus] hvd.elastic: the hosts changed: shrank in place from %d to "
                         "%d rank(s) in %.1f s\n" % (before, basics.size(),
                                                      time.monotonic() - started))
        sys.stderr.flush()
