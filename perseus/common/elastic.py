"""Horovod's elastic API (hvd.elastic) on MPI's fixed world: state objects that
commit, restore and sync, and run(), which retries a training function after a
HorovodInternalError.

What is the same as Horovod: State / ObjectState and their methods, reset
callbacks, and run()'s loop (sync, call; on HorovodInternalError restore the last
commit, reset, fire the callbacks, sync again, call again).

What differs: Perseus runs on the ranks mpirun started, and there is no driver and
no re-rendezvous (ranks are added only by a grow in place, below). A rank that fails
is left behind when the job can outlive it (Open MPI 5's ULFM, `mpirun --with-ft
ulfm`): the survivors' world shrinks in place at the reset (reset()), else the failure
ends the job as MPI's does. A shrink below perseusrun's --min-np (PERSEUS_ELASTIC_MIN_NP)
does not go on: the ranks stop for perseusrun to restart the job where it can, else
fail (_stop_below_min_np).
Outside a job started with a discovery script (below), commit() never finds host
updates (and so costs no collective), and a HostsUpdatedInterrupt (a resize request)
ends run() with an error saying what elastic resizing needs. The framework modules
(perseus.torch.elastic, perseus.tensorflow.elastic) add their states and run().

Where the MPI has no ULFM, `perseusrun --elastic` restarts the whole job when a rank
dies (perseus/launcher.py sets PERSEUS_ELASTIC_RUN_ID and PERSEUS_ELASTIC_RESTARTS in
the ranks); with ULFM and -H/--hostfile it restarts the job when Open MPI 5 lost a host
whole (a rank that dies is left behind in place). Wherever perseusrun gives a run id,
run() persists every PERSEUS_ELASTIC_PERSIST_INTERVAL-th commit (rank 0 writes it
atomically into a private folder, perseus.common.private_files), and a restarted job's
run() resumes from the last one persisted (_Persister).

Under `perseusrun --elastic --host-discovery-script` (perseus/launcher_elastic.py) the
job also follows its hosts: perseusrun writes a new generation into a notice file
(PERSEUS_ELASTIC_NOTICE) when the hosts change; at each commit (and
check_host_updates()) rank 0 stats it and one broadcast tells every rank, so all raise
HostsUpdatedInterrupt at the same commit. run() then persists that commit, the ranks
exit with HOSTS_UPDATED_EXIT, and perseusrun starts the job again on the new hosts,
where run() resumes from it.

On a ULFM core perseusrun resizes such a job in place instead (PERSEUS_ELASTIC_GROW=1
in the ranks): the ranks whose slots are gone from the notice leave (their process
ends, exit code 0) and the others go on with their ranks in order
(elastic_in_place.shrink); where the notice wants more ranks than stay, run() shuts
the engine down and init() starts the new ranks with MPI_Comm_spawn (the same command
line; on hosts the job does not run on yet, Open MPI adds them and starts its daemon
there) and merges them after the old ones (elastic_in_place.grow); the old processes
go on, keeping their ranks, and the sync that follows gives rank 0's state to the new
ones, whose own run() joins that sync (_join_grown_job). A host replaced by another
takes both. What cannot be made so (no running rank's host kept, a rank a grow
spawned leaving) takes the restart (elastic_in_place.decide says why).
"""

import functools
import gc
import os
import pickle
import sys

from perseus.common import basics, elastic_in_place, private_files
from perseus.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

# The exit code of ranks that stop for new hosts; perseusrun restarts the job on them.
HOSTS_UPDATED_EXIT = 75
# The exit code of ranks that stop because a failure left fewer than --min-np of them
# (_stop_below_min_np): perseusrun waits for --min-np slots and restarts the job. A code
# of its own: perseusrun takes HOSTS_UPDATED_EXIT only with a new generation of hosts.
BELOW_MIN_NP_EXIT = 76
# The exit code of the ranks of a job that grew in place when a rank fails: Open MPI 5
# runs the processes a grow spawned as a job of its own that it does not make fault
# tolerant, and ends everything when one dies (racing the survivors' recovery), so the
# ranks stop at their last persisted commit and perseusrun restarts the job
# (_stop_grown_job_after_failure).
GROWN_JOB_FAILED_EXIT = 77

RESIZE_UNSUPPORTED = (
    "elastic resizing (adding or removing workers) needs perseusrun --elastic "
    "--host-discovery-script (with --min-np/--max-np), which restarts the job on the new "
    "hosts; this job was started without it, on MPI's fixed world of ranks, so "
    "hvd.elastic.run only retries after a HorovodInternalError, on the same %d ranks")


class BelowMinNpError(RuntimeError):
    """A failure left fewer ranks than perseusrun's --min-np, and nothing can add ranks
    to the job (raised by hvd.elastic.run on every survivor, same message)."""


class State:
    """State kept in memory on every worker: commit() saves it, restore() rolls back
    to the last commit, sync() makes every rank hold rank 0's.

    bcast_object(obj) -> rank 0's obj; get_rank() -> this rank. Subclasses
    implement save, restore, sync and reset.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self._persister = None  # run() sets it when perseusrun --elastic restarts the job

    def register_reset_callbacks(self, callbacks):
        """Functions called (no arguments) after every reset, e.g. to rescale the
        learning rate or rebuild a data loader."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        """Called by Horovod's driver on a host change; there is none here."""
        raise NotImplementedError(RESIZE_UNSUPPORTED % basics.size())

    def commit(self):
        """Saves the state (the next restore() returns to it) and checks for host
        updates. Saving copies every tracked value: commit every few batches, not
        after each. In a job that perseusrun --elastic restarts (an MPI without ULFM),
        every PERSEUS_ELASTIC_PERSIST_INTERVAL-th commit is also persisted (every rank
        takes part; rank 0 writes)."""
        self.save()
        persister = getattr(self, "_persister", None)  # a subclass may skip State.__init__
        if persister is not None:
            persister.commit(self)
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt, on every rank at once, when perseusrun
        --host-discovery-script found other hosts or slots. Rank 0 stats perseusrun's
        notice file and one broadcast tells the others (Horovod's commit broadcasts
        its last update's timestamp likewise). Without a discovery script there is
        never an update, and nothing is checked or sent."""
        watch = _host_watch()
        if watch is None:
            return
        updated = watch.updated() if basics.rank() == 0 else False
        if self._bcast_object(updated):
            raise HostsUpdatedInterrupt()

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Called after a reset, before the callbacks; nothing to do by default."""

    def _persisted(self):
        """The last commit as picklable data, for a job that perseusrun --elastic may
        restart. Every rank calls it (it may take a collective); rank 0's is written."""
        raise NotImplementedError()

    def _load_persisted(self, data):
        """Makes `data` (what _persisted returned) the last commit (restore() then
        returns to it)."""
        raise NotImplementedError()


class ObjectState(State):
    """State made of picklable Python objects, given as keyword arguments and
    exposed as attributes (state.epoch, state.batch, ...). sync() broadcasts the
    last committed values from rank 0."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)

    def _persisted(self):
        return dict(self._saved_state)

    def _load_persisted(self, data):
        self._saved_state = dict(data)


def _defining(cls, name):
    return next(k for k in cls.__mro__ if name in k.__dict__)


def can_persist(state):
    """Whether `state` can persist its commits: the class that saves it also says how
    to persist it (ObjectState, TorchState); a subclass with a save() of its own, such
    as TensorFlow's states, cannot yet."""
    cls = type(state)
    owner = _defining(cls, "_persisted")
    return owner is not State and owner is _defining(cls, "save")


PERSIST_PREFIX = "commit."


def persist_dir():
    """The folder commits are persisted to: PERSEUS_ELASTIC_PERSIST_DIR, else the cache's
    elastic/ (perseusrun reads the same to remove a finished job's file)."""
    return (os.environ.get("PERSEUS_ELASTIC_PERSIST_DIR")
            or os.path.join(private_files.cache_dir(), "elastic"))


def persist_path(folder, run_id):
    return os.path.join(folder, "%s%s.pkl" % (PERSIST_PREFIX, run_id))


def notice_path(folder, run_id):
    """perseusrun's notice of host changes for run `run_id` (launcher_elastic.py)."""
    return os.path.join(folder, "hosts.%s" % run_id)


class _HostWatch:
    """Rank 0's view of perseusrun's notice: `generation np hosts daemons`, read only when a
    stat says the file changed."""

    def __init__(self, path, generation):
        self.path, self.generation, self.seen = path, generation, None

    def updated(self):
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self.seen:
            return False
        self.seen = key
        notice = self.read()
        return notice is not None and notice[0] > self.generation

    def read(self):
        """(generation, np, [(host, slots), ...], [host, ...] where Open MPI may run its
        daemon, not perseusrun's machine) of the notice, or None."""
        try:
            with open(self.path) as f:
                words = f.readline().split()
            hosts = words[2].split(",") if len(words) > 2 else []
            daemons = words[3].split(",") if len(words) > 3 and words[3] != "-" else []
            return int(words[0]), int(words[1]), [
                (h.rpartition(":")[0], int(h.rpartition(":")[2])) for h in hosts], daemons
        except (OSError, ValueError, IndexError):
            return None


_watch = [None, False]  # the watch, and whether the environment was read


def _host_watch():
    """The notice to watch when perseusrun --elastic follows the job's hosts (a discovery
    script, or fixed hosts with a cooldown range), else None."""
    if not _watch[1]:
        _watch[1] = True
        path = os.environ.get("PERSEUS_ELASTIC_NOTICE")
        if path:
            _watch[0] = _HostWatch(path, int(os.environ.get("PERSEUS_ELASTIC_GENERATION", "0")))
    return _watch[0]


def grows_in_place():
    """Whether perseusrun --host-discovery-script grows this job in place when hosts are
    added (PERSEUS_ELASTIC_GROW=1: a ULFM core, started with it)."""
    return os.environ.get("PERSEUS_ELASTIC_GROW") == "1" and basics.fault_tolerance()[0]


def _resize_watch():
    """The notice a resize in place reads (elastic_in_place.decide): the host watch where
    perseusrun grows this job in place, else None (every change takes the restart)."""
    return _host_watch() if grows_in_place() else None


def min_np():
    """perseusrun's --min-np (PERSEUS_ELASTIC_MIN_NP, set only where given), else 0: the
    fewest ranks hvd.elastic.run trains on after a shrink in place."""
    text = os.environ.get("PERSEUS_ELASTIC_MIN_NP", "")
    return int(text) if text.isdigit() else 0


def restart_run():
    """(run id, restarts so far, restart limit) when perseusrun --elastic restarts this
    job after a rank dies (a core without ULFM), else None."""
    run_id = os.environ.get("PERSEUS_ELASTIC_RUN_ID")
    if not run_id:
        return None
    return (run_id, int(os.environ.get("PERSEUS_ELASTIC_RESTARTS", "0")),
            int(os.environ.get("PERSEUS_ELASTIC_RESET_LIMIT", "0")))


class PersistError(private_files.UnsafePathError):
    """Commits cannot be persisted where asked; raised on every rank, same message."""


class _Persister:
    """Persists every interval-th commit of a job that perseusrun --elastic restarts,
    and resumes a restarted job from the last one. Made on every rank at run()'s first
    call; rank 0 checks the folder and the others learn its verdict (one broadcast), so
    a bad folder fails every rank with the same message."""

    def __init__(self, state, run_id):
        from perseus.common.objects import broadcast_object
        self._broadcast = broadcast_object
        self.run_id = run_id
        self.interval = int(basics.config().get("PERSEUS_ELASTIC_PERSIST_INTERVAL", "1"))
        self.commits = 0
        self.persisted = 0  # the number of the last commit written
        folder = persist_dir()
        self.path = persist_path(folder, run_id)
        problem = None
        if not can_persist(state):
            problem = ("%s cannot persist its commits yet (ObjectState and TorchState can), "
                       "so a job that perseusrun --elastic restarts could not resume from one"
                       % type(state).__name__)
        elif basics.rank() == 0:
            try:
                private_files.private_folder(folder)
                private_files.check_writable(self.path)
            except OSError as e:
                problem = "PERSEUS_ELASTIC_PERSIST_DIR: %s" % e
        problem = broadcast_object(problem, root_rank=0)
        if problem:
            raise PersistError("hvd.elastic.run cannot persist commits for perseusrun "
                               "--elastic's restart: " + problem)

    def commit(self, state):
        self.commits += 1
        if self.commits % self.interval:
            return
        self.write(state)

    def agree(self):
        """Every rank takes rank 0's counts, after a reset: a failure that the others
        survive (ULFM) may catch them on either side of a commit, and with an interval
        above 1 they must still persist the same commits, which gather (every rank)."""
        self.commits, self.persisted = self._broadcast((self.commits, self.persisted),
                                                       root_rank=0)

    def write_last(self, state):
        """write() unless the last commit is on disk already (every rank calls it)."""
        if self.persisted != self.commits:
            self.write(state)

    def write(self, state):
        """Persists the last commit (every rank calls it; rank 0 writes)."""
        self.persisted = self.commits
        data = state._persisted()  # on every rank: it may gather (the samplers' records)
        if basics.rank() == 0:
            with private_files.replace_privately(self.path) as f:
                pickle.dump({"run": self.run_id, "commit": self.commits, "state": data}, f,
                            protocol=pickle.HIGHEST_PROTOCOL)

    def resume(self, state):
        """Rank 0 loads the last persisted commit of this run into `state` (the sync
        that follows gives it to every rank); -> its commit number on every rank, or
        None when none was persisted."""
        loaded = problem = None
        if basics.rank() == 0:
            try:
                loaded = self._load(state)
            except Exception as e:  # told to every rank, which would else wait for rank 0
                problem = "cannot resume from %s: %s: %s" % (self.path, type(e).__name__, e)
        loaded, problem = self._broadcast((loaded, problem), root_rank=0)
        if problem:
            raise PersistError("hvd.elastic.run " + problem)
        if loaded is not None:
            self.commits = self.persisted = loaded
        return loaded

    def _load(self, state):
        folder = os.path.dirname(self.path)
        for name in os.listdir(folder):  # a write that a kill cut short
            if name.startswith(".%s" % os.path.basename(self.path)) and name.endswith(".tmp"):
                os.unlink(os.path.join(folder, name))
        if not os.path.lexists(self.path):
            return None
        with private_files.open_private(self.path) as f:
            record = pickle.load(f)
        if record.get("run") != self.run_id:
            return None
        state._load_persisted(record["state"])
        state.restore()
        return record["commit"]


def reset():
    """What follows a failure before the next attempt. Horovod shuts down and
    re-initialises to join a new world. Here, when a rank of the world failed (a
    fault-tolerant job: basics.fault_tolerance()), shutdown() and init() form the world
    of the survivors in place (ranks and sizes change; process sets other than the
    global one are gone: register them again in a reset callback). After any other
    HorovodInternalError the world is the same, and the engine, which reports a
    collective's failure on every rank and goes on, is kept; only an engine that was
    shut down is started again."""
    if basics.is_initialized() and basics.world_failed():
        basics.shutdown()
    if not basics.is_initialized():
        basics.init()


_said_mode = False


def mode():
    """(mode, why): "shrink" (a rank that fails is left behind: ULFM), "restart"
    (perseusrun --elastic restarts the job from the last persisted commit) or "end"."""
    enabled, why = basics.fault_tolerance()
    if enabled:
        run = restart_run()
        if _host_watch() is not None and grows_in_place():
            why += ("; perseusrun --elastic --host-discovery-script started it and grows or "
                    "shrinks it in place when hosts are added or removed (other changes restart "
                    "it)")
        elif run is not None:
            why += ("; perseusrun --elastic -H/--hostfile started it and restarts it on the "
                    "hosts left, from the last persisted commit, when Open MPI loses a host "
                    "whole (restart %d of at most %d)" % (run[1], run[2]))
        if min_np():
            why += "; " + BELOW_MIN_NP_MODE % (min_np(), "stop for perseusrun to restart it"
                                               if run is not None else "fail")
        return "shrink", why
    run = restart_run()
    if run is not None:
        if _host_watch() is not None:
            # A discovery script's hosts, or fixed ones whose blacklisted host can come
            # back from its cooldown (launcher_elastic.run_growing).
            return "restart", ("perseusrun --elastic started this job, follows its hosts and "
                               "restarts it when they change or a rank dies (restart "
                               "%d of at most %d)" % (run[1], run[2]))
        return "restart", ("%s; perseusrun --elastic started this job and restarts it when a "
                           "rank dies (restart %d of at most %d)" % (why, run[1], run[2]))
    return "end", why


def _say_mode():
    """Once per process, on rank 0: whether a lost rank is recovered in place, restarts
    the job, or ends it, and why (issue 46: the mode is stated when the job starts)."""
    global _said_mode
    if _said_mode:
        return
    _said_mode = True
    kind, why = mode()
    if basics.rank() == 0:
        sys.stderr.write("[perseus] hvd.elastic: %s: %s\n" % ({
            "shrink": "a rank that fails is left behind and training goes on with the others",
            "restart": "a rank that fails restarts the job, which resumes from the last "
                       "persisted commit",
            "end": "a rank that fails ends the job"}[kind], why))
        sys.stderr.flush()


_grown = [False]  # this process's world holds processes a grow in place spawned


def _stop_grown_job_after_failure():
    """A rank of a job that grew in place failed (or the world broke, as when Open MPI
    ends the spawned processes): stop at the last persisted commit, for perseusrun to
    restart the job, rather than race Open MPI, which ends the whole job when a process
    a grow spawned dies. Conservative: the death of a rank mpirun started takes this
    route too once the job grew."""
    if basics.rank() == 0:
        sys.stderr.write("[perseus] hvd.elastic: a rank failed after the job grew in place: "
                         "Open MPI 5 does not outlive the failure of a process a grow spawned, "
                         "so the ranks stop at their last persisted commit (exit code %d) and "
                         "perseusrun starts the job again\n" % GROWN_JOB_FAILED_EXIT)
        sys.stderr.flush()
    _leave_for_perseusrun(GROWN_JOB_FAILED_EXIT)


def _start_persisting(state):
    """In a job that perseusrun --elastic restarts: persist `state`'s commits from now
    on and, in a restarted job, load the last one persisted (rank 0; the sync that
    follows gives it to all)."""
    run = restart_run()
    # perseusrun gives a run id only to a job it may restart: without ULFM, under a
    # discovery script, and on fixed hosts under ULFM (a host lost whole ends the job).
    if run is None or getattr(state, "_persister", None) is not None:
        return
    if basics.joined_job():  # started by a grow in place: join the old ranks' steps
        _grown[0] = True
        _join_grown_job(state)
        return
    state._persister = persister = _Persister(state, run[0])
    if run[1] > 0:
        commit = persister.resume(state)
        if basics.rank() == 0:
            sys.stderr.write("[perseus] hvd.elastic: restart %d: %s\n" % (
                run[1], "resuming from persisted commit %d on %d rank(s)" % (
                    commit, basics.size()) if commit is not None
                else "no commit was persisted before the failure: starting from the beginning"))
            sys.stderr.flush()
        if commit is not None:
            # As Horovod after a reset: every rank holds the commit when the reset
            # callbacks run (e.g. to rescale the learning rate to the new size), and
            # the sync that follows gives rank 0's state to all.
            state.sync()
            state.on_reset()


def _stop_for_new_hosts(state):
    """HostsUpdatedInterrupt under perseusrun --host-discovery-script: persist the commit
    just made (Horovod does not restore on a host update: nothing is lost), leave, and
    let perseusrun start the job on the new hosts."""
    persister = getattr(state, "_persister", None)
    if persister is not None:
        persister.write_last(state)
    if basics.rank() == 0:
        sys.stderr.write("[perseus] hvd.elastic: the hosts changed: commit %d is persisted; "
                         "the job stops here and perseusrun starts it on the new hosts\n"
                         % (persister.commits if persister is not None else 0))
        sys.stderr.flush()
    _leave_for_perseusrun(HOSTS_UPDATED_EXIT)


def _leave_for_perseusrun(code):
    """Shuts the engine down and ends the process with `code`, for perseusrun to start
    the job again."""
    basics.shutdown()
    # The process ends now. Freezing what it holds spares the interpreter's garbage
    # collections at exit, which walk every object: with torch's, the old job's exit
    # took 3.1-4.5 s of the restart here, 0.6-0.7 s frozen (2 -> 4 -> 2 ranks, loaded;
    # benchmarks/elastic_recovery.py --hosts-added). finally blocks and atexit handlers
    # still run; only cycles made before here are never collected.
    gc.freeze()
    raise SystemExit(code)


# What follows a shrink in place below --min-np (perseusrun gives it: min_np()), the one
# place of each text: the mode's note, rank 0's line on the restart route, the error.
BELOW_MIN_NP_MODE = "below --min-np %d rank(s) the survivors %s"
BELOW_MIN_NP = "%d rank(s) left after a failure, fewer than --min-np %d"
BELOW_MIN_NP_STOP = ("[perseus] hvd.elastic: %s: commit %d is persisted; the ranks stop here "
                     "(exit code %d) and perseusrun starts the job again once its hosts offer "
                     "--min-np slots, waiting for them up to --elastic-timeout\n")
BELOW_MIN_NP_FAILS = ("hvd.elastic.run cannot go on: %s, and nothing can add ranks to this job "
                      "(perseusrun --elastic runs it once, on this machine: no other host to "
                      "restart it on, no --host-discovery-script); lower --min-np, or start "
                      "it with -H/--hostfile naming other hosts or with "
                      "--host-discovery-script, for perseusrun to wait for hosts and restart "
                      "it from the last persisted commit")


def _below_min_np():
    """Whether the world, after a reset, has fewer ranks than --min-np (never without it)."""
    return min_np() > 0 and basics.size() < min_np()


def _stop_below_min_np(state):
    """After a shrink in place below --min-np, on every survivor (they agree: the shrink
    gave each the same size): the user's function is not called again with too few
    ranks. Where perseusrun can bring ranks back (it gave a run id: run_growing, which
    waits for --min-np slots up to the elastic timeout and restarts the job), the restored
    commit is persisted and the ranks leave with BELOW_MIN_NP_EXIT; else each raises
    BelowMinNpError. Rank 0 says which on stderr."""
    reason = BELOW_MIN_NP % (basics.size(), min_np())
    persister = getattr(state, "_persister", None)
    if persister is None:
        if basics.rank() == 0:
            sys.stderr.write("[perseus] hvd.elastic: %s\n" % (BELOW_MIN_NP_FAILS % reason))
            sys.stderr.flush()
        raise BelowMinNpError(BELOW_MIN_NP_FAILS % reason)
    try:
        # Rank 0's commit and counts on every rank, as after any reset: the failure may
        # have caught the ranks on either side of a commit.
        state.sync()
        persister.agree()
        persister.write_last(state)
    except HorovodInternalError:
        pass  # one more rank failed meanwhile: the last commit persisted before stands
    if basics.rank() == 0:
        sys.stderr.write(BELOW_MIN_NP_STOP % (reason, persister.persisted, BELOW_MIN_NP_EXIT))
        sys.stderr.flush()
    _leave_for_perseusrun(BELOW_MIN_NP_EXIT)


def _join_grown_job(state):
    """Every rank of a job that just grew in place, the new ones at their run()'s start:
    the persister of the restart route (for host changes that are not a grow) made again
    over the new world, its counts rank 0's."""
    run = restart_run()
    if run is None:
        return
    old = getattr(state, "_persister", None)
    state._persister = persister = _Persister(state, run[0])
    counts = (old.commits, old.persisted) if old is not None else None
    counts = persister._broadcast(counts, root_rank=0)
    if counts is not None:
        persister.commits, persister.persisted = counts


# The sync after a reset failed on the same world (no rank of it failed under ULFM): one
# that cannot work any more, e.g. a peer the engine gave up at the peer timeout (stopped,
# or on a host cut off), which ULFM does not count as failed. Trying again would loop.
SAME_WORLD_BROKEN = ("hvd.elastic.run cannot go on: the state's sync after a reset failed "
                     "again on the same ranks (no process of the world ended, which alone "
                     "would leave survivors to go on with): %s")


def run_fn(func, reset_fn=reset):
    """Decorates func(state, *args, **kwargs): syncs `state` from rank 0, then
    calls func; after a HorovodInternalError (in either) restores the last commit,
    resets, fires the reset callbacks and tries again (not below --min-np:
    _stop_below_min_np). Returns func's result."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        _say_mode()
        _start_persisting(state)
        after_reset = False
        failed = False  # since the last sync: the persister's counts may differ
        while True:
            syncing = True
            try:
                # Inside: a rank that fails during the sync after a failure is one more.
                state.sync()
                persister = getattr(state, "_persister", None)
                if failed and persister is not None:
                    persister.agree()  # the state is rank 0's commit now: its counts too
                failed = syncing = False
                return func(state, *args, **kwargs)
            except HorovodInternalError as e:
                if _grown[0] and restart_run() is not None and (
                        basics.world_failed() or (syncing and after_reset)):
                    _stop_grown_job_after_failure()  # leaves the process
                if syncing and after_reset and not basics.world_failed():
                    raise HorovodInternalError(SAME_WORLD_BROKEN % e) from e
                state.restore()
                failed = True
            except HostsUpdatedInterrupt as e:
                if _host_watch() is None or getattr(state, "_persister", None) is None:
                    raise NotImplementedError(RESIZE_UNSUPPORTED % basics.size()) from e
                resize = elastic_in_place.decide(state, _resize_watch())
                if resize is None:
                    _stop_for_new_hosts(state)  # leaves the process
                if resize.stays is not None:
                    elastic_in_place.shrink(state, resize.stays, resize.left_here)
                if resize.add:
                    elastic_in_place.grow(state, resize.add, resize.places)
                    _grown[0] = True
                _join_grown_job(state)
            reset_fn()
            after_reset = True
            if _below_min_np():
                _stop_below_min_np(state)  # leaves the process, or raises
            state.on_reset()

    return wrapper
