"""Resizing a running job in place (issue 46, point 3), for hvd.elastic.run
(perseus/common/elastic.py) on a ULFM core under perseusrun --elastic
--host-discovery-script: at a HostsUpdatedInterrupt, whether the notice's change can be
made in place (decide: the ranks whose slots are gone leave, then new ones are spawned
from those left where the notice wants more), and making it (shrink: the core splits
the job and the ranks that leave end; grow: the core spawns the new ranks and merges
them). What cannot be made so takes the restart, which elastic.py runs; so does the
persister's part (elastic.py's _join_grown_job, which every rank runs after either). The
exit code the core leaves a failed resize with is elastic.HOSTS_UPDATED_EXIT's (75)."""

import dataclasses
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
    notice, machines the host of each rank that stays (staying_ranks: none runs more
    ranks than the plan gives it). perseusrun's plan fills the hosts in order
    (launcher_elastic.plan); the ranks that stay keep their hosts. -> [(host, new
    ranks)] in rank order."""
    places, left = [], np
    for host, slots in hosts:
        wanted = min(slots, left)
        left -= wanted
        more = wanted - machines.count(host)
        if more > 0:
            places.append((host, more))
    return places


def staying_ranks(np, hosts, machines, spawned):
    """Which ranks stay through a resize in place: np and hosts [(host, slots)] of the
    notice, machines the notice's host of each rank now (None: its host is not in it),
    spawned whether each was started by a grow. Each host keeps its lowest ranks, as many
    as perseusrun's plan gives it (filled in order: launcher_elastic.plan); a host gone
    from the notice keeps none. -> ([stays, ...] a rank, None), or (None, why) where no
    rank would stay (none is left to spawn the new ones) or a rank started by a grow
    would leave: Open MPI 5.0.11 ends the whole job when a process of a spawned job ends
    without MPI_Finalize (it does not make that job fault tolerant:
    docs/investigations/grow-in-place.md), and its MPI_Finalize would wait for the job's
    end. Those take the restart."""
    wanted, left = {}, np
    for host, slots in hosts:
        wanted[host] = min(slots, left)
        left -= wanted[host]
    stays = []
    for host in machines:
        stay = host is not None and wanted.get(host, 0) > 0
        if stay:
            wanted[host] -= 1
        stays.append(stay)
    grown = [str(rank) for rank, stay in enumerate(stays) if spawned[rank] and not stay]
    if grown:
        return None, ("rank(s) %s would leave, started by a grow: Open MPI ends the job when "
                      "such a process leaves it" % ",".join(grown))
    if not any(stays):
        return None, "no host of the running ranks keeps a rank"
    return stays, None


def placed_grow_refused(places, daemons):
    """Why a grow in place may not place its new ranks on their hosts (`places`), or
    None: Open MPI 5.0.11's spawn onto a host of a job whose daemons already run on
    another host than mpirun's (`daemons`, perseusrun's notice) ended the job: "PRTE has
    lost communication with a remote daemon" after the new ranks started, 3 runs of 3
    for hostA:2,hostB:2 -> hostA:1,hostB:3 (1 of 5 another time), and every run adding
    a third host beside a second (namespace hosts; docs/investigations/grow-in-place.md).
    From a job on mpirun's machine alone, the grows onto other hosts held. Those take
    the restart."""
    if daemons:
        return ("placing new ranks on %s while Open MPI's daemons run on %s, which Open MPI "
                "5.0.11 fails at" % (",".join(h for h, _ in places), ",".join(daemons)))
    return None


@dataclasses.dataclass
class Resize:
    """A change made in place (decide's): stays, whether this rank stays through a
    shrink (None: every rank stays), and left_here, the process ids of the ranks that
    leave from this rank's host; then add, the ranks a grow adds (0: none), and places,
    where (None: as MPI places them on the one machine the job runs on; else
    ("host:n,..." of the new ranks, "host:slots,..." of the hosts to add))."""
    stays: object
    add: int
    places: object
    left_here: list = dataclasses.field(default_factory=list)


def decide(state, watch):
    """At a HostsUpdatedInterrupt, on every rank: the Resize that makes the notice's change
    in place (the ranks whose slots are gone leave, then the new ones are spawned from
    those left: a shrink, a grow, or both, as when a host is replaced), or None for the
    restart. Rank 0 reads the notice; one broadcast tells all, one allgather says where
    each rank runs; rank 0 says why a change in place is not taken."""
    notice = None
    if basics.rank() == 0 and watch is not None:
        notice = watch.read()
    notice = state._bcast_object(notice)
    if notice is None:
        return None
    from perseus.common.objects import allgather_object
    generation, np, hosts, daemons = notice
    machines, spawned, pids = zip(*allgather_object((my_host(hosts), basics.joined_job(),
                                                     os.getpid())))
    stays, why = staying_ranks(np, hosts, list(machines), spawned)
    if why is None:
        kept = [host for host, stay in zip(machines, stays) if stay]
        places = grow_places(np, hosts, kept)
        added = [host for host, _ in places if host not in kept]
        # Placed on their hosts unless all go to the one machine the job runs on.
        placed = bool(places) and not (len(set(kept)) == 1 and not added)
        if placed:
            why = placed_grow_refused(places, daemons)
    if why is not None:
        if basics.rank() == 0:
            sys.stderr.write("[perseus] hvd.elastic: the hosts changed: not resized in place "
                             "(%s)\n" % why)
            sys.stderr.flush()
        return None
    if watch is not None:
        watch.generation = generation
    me = basics.rank()
    resize = Resize(None if all(stays) else stays[me], np - len(kept), None,
                    [pid for pid, host, stay in zip(pids, machines, stays)
                     if not stay and host == machines[me]])
    if placed:
        # Hosts no rank runs on yet join the job's with their slots (Open MPI starts its
        # daemon there).
        slots = dict(hosts)
        resize.places = (",".join("%s:%d" % place for place in places),
                         ",".join("%s:%d" % (host, slots[host]) for host in added))
    return resize


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


def wait_until_gone(pids, timeout_s=10.0):
    """Waits (bounded) for the processes `pids` of this host to be gone, reaped by Open
    MPI's daemon: the ranks that left in a shrink end at once, but a grow right after it
    (a shrink and a grow at once) took one still ending for a process of the job lost
    during the spawn, and gave up."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
            time.sleep(0.01)


def shrink(state, keep, left_here=()):
    """Ends this rank's part in the job unless `keep` (decide's), every rank
    together: shutdown, then the core splits the job's processes (perseus_keep_in_job);
    the ranks that leave end their process at once (exit code 0: no MPI_Finalize, which
    would wait for the job's end; Python's atexit hooks do not run), and the others
    form their world in their rank order, the old rank 0 first, with the commit just
    made (persisted first: should a process end during the split, the others leave with
    HOSTS_UPDATED_EXIT and perseusrun restarts the job from it), then wait for those of
    their host that left (`left_here`, their process ids) to be gone."""
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
    wait_until_gone(left_here)
    if basics.rank() == 0:
        sys.stderr.write("[perseus] hvd.elastic: the hosts changed: shrank in place from %d to "
                         "%d rank(s) in %.1f s\n" % (before, basics.size(),
                                                      time.monotonic() - started))
        sys.stderr.flush()
