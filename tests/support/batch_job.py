"""The launching side of a batch: one MPI job in which tests/support/rank_batch.py runs
several rank scripts in turn, each under variables of its own. tests/conftest.py's
run_mpi_batch starts its batches here, and tests/gpu/test_gpu.py a GPU configuration's
scripts (issue 47): a process start, a torch import, a CUDA context and NCCL's first
set-up once per job and rank, instead of once per script.

    job = batch_job.run({"allreduce[own]": ("allreduce", {"PTEST_DEVICE": "cuda"}), ...},
                        np, env, timeout, scratch)
    job.ended("allreduce[own]")   # every rank returned from it
    job.window("allreduce[own]")  # the job's stdout while rank 0 ran it
    job.seconds("allreduce[own]") # how long rank 0 took in it (its BATCH TIME line)

An entry's name is its script's, or "<script>[<setting>]" to run a script more than
once (rank_batch.py's form); its variables are set on top of `env` for it alone.
`log`: a file the job's output is appended to as it comes, so that a run cut short
(scripts/gpu_check.sh at its time budget) still shows which scripts ended. A script
that fails ends the job (tests/support/rank_script.py); the caller runs it, and those
after it, alone, where its own report is the test's.

    job.exit_failure()  # why the job failed after every entry ended, or None

A job whose every entry ended must then leave as a script alone does, with code 0 and
in time: its end (rank_batch.py: Python's atexit hooks, Perseus's shutdown among them,
then C's exit(): MPI_Finalize, destructors) is every entry's end, so a non-zero code
there (a rank that died, or a hook's os._exit(3)) fails each test whose entry it
saw through (exit_failure's message names the code and the entries). A job that ended
early has its code from the entry that did not end, which runs alone.
"""
import json
import re
from pathlib import Path

from support.jobs import RANK_SCRIPTS, TESTS_DIR, bounded_job, rank_job


class BatchJob:
    def __init__(self, names, np, out, returncode=0, err="", killed=None, cmd=()):
        self.out = out
        self._names = list(names)
        self._ended = {n for n in names if out.count("BATCH END %s\n" % n) == np}
        self._np, self._returncode, self._err, self._killed, self._cmd = np, returncode, err, killed, cmd

    def ended(self, name):
        return name in self._ended

    def exit_failure(self):
        """Why the job failed although every entry ended (its exit code, or it outlived
        its timeout), with the entries and what the job wrote after the last one; None
        if it left cleanly, or if an entry did not end (that entry's own run, alone,
        reports it)."""
        if len(self._ended) < len(self._names) or (self._returncode == 0 and self._killed is None):
            return None
        if self._killed is not None:
            what = "did not leave within its timeout (killed); still alive:\n%s" % self._killed
        else:
            what = "exited with code %d" % self._returncode
        last = self.out.rfind("[rank 0] BATCH END %s\n" % self._names[-1])
        return ("the batch job of %d ranks %s after all its %d scripts ended (its exit: atexit "
                "hooks, Perseus's shutdown, MPI_Finalize); scripts: %s\ncommand: %s\n"
                "----- stdout after rank 0's last script -----\n%s\n----- stderr (end) -----\n%s"
                % (self._np, what, len(self._names), " ".join(self._names), " ".join(self._cmd),
                   self.out[last:][-6000:], self._err[-6000:]))

    def seconds(self, name):
        """Rank 0's time in the entry (rank_batch.py's BATCH TIME line), None if it did not end."""
        found = re.search(r"^\[rank 0\] BATCH TIME %s ([0-9.]+)$" % re.escape(name), self.out, re.M)
        return float(found.group(1)) if found else None

    def window(self, name):
        """The job's stdout from rank 0's end of the entry before `name` (or the job's
        start) to its end of `name`: every rank's lines printed meanwhile, among them
        rank 0's for that entry."""
        end = "[rank 0] BATCH END %s\n" % name
        stop = self.out.find(end)
        if stop < 0:
            return ""
        index = self._names.index(name)
        start = self.out.find("[rank 0] BATCH END %s\n" % self._names[index - 1]) if index else 0
        return self.out[max(start, 0):stop + len(end)]


def run(entries, np, env, timeout, scratch, python=None, scripts_dir=RANK_SCRIPTS, log=None):
    """Runs `entries` ({name: (script, variables)}, in order) in one job of np ranks with
    `env` under them -> BatchJob. Never fails by itself: what did not end, and a job
    that failed at its exit (BatchJob.exit_failure), are the caller's to report."""
    args = [str(Path(scripts_dir) / ("%s.py" % script)) + name[len(script):]
            for name, (script, _) in entries.items()]
    job_env = dict(env)
    own = {name: variables for name, (_, variables) in entries.items() if variables}
    if own:
        job_env["PTEST_BATCH_ENV"] = json.dumps(own)
    cmd, child_env = rank_job(args, np, job_env, timeout, python, None, scratch)
    if len(args) == 1:  # rank_job runs a lone script by itself
        cmd.insert(cmd.index(args[0]), str(TESTS_DIR / "support" / "rank_batch.py"))
    if log is not None:  # a copy of each line as it comes, both streams
        cmd = ["bash", "-c", '"$@" > >(tee -a "$0") 2> >(tee -a "$0" >&2)', str(log)] + cmd
    returncode, out, err, _, killed = bounded_job(cmd, child_env, timeout)
    return BatchJob(entries, np, out, returncode, err, killed, cmd)
