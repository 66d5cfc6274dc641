"""Runs several rank scripts one after another in this process: one MPI job, and one
interpreter start and framework import per rank for all of them instead of one each
(4 ranks importing TensorFlow take 10 s on 2 cores). tests/conftest.py's run_mpi_batch
starts it; a test whose script the batch did not see through runs it alone.

    mpirun -np N python tests/support/rank_batch.py <script.py> [<script.py>[<setting>] ...]

Each script runs as python would run it alone (a fresh __main__, its folder first
on sys.path, sys.argv), with a scratch directory of its own in $PTEST_TMPDIR and the
environment restored after it; Perseus is shut down after it if it left it running.
"<script.py>[<setting>]" runs the script with the variables that $PTEST_BATCH_ENV (a
JSON object by name, "<script>[<setting>]") gives it set on top: the same script under
several settings that the core reads at each init() (run_mpi_batch's `settings`).
"[rank r] BATCH END <name>" on stdout says the script returned; a script that fails
ends the process at once (rank_script.main), so the END lines say how far it got.
The batch leaves without the interpreter's teardown, as a script alone does, and its
exit code counts as a script's does: one that is not 0 after every END line fails the
batch's tests (batch_job.py's exit_failure).
Rank 0 writes "BATCH TIME <name> <seconds>" just before its END line: how long the
script took there (scripts/gpu_check.sh keeps them as measured costs of its plan).
Framework-free: it runs in the TensorFlow and MXNet venvs too.
"""
import json
import os
import runpy
import sys
import time

# Run as a script: its own folder is on sys.path, tests/ (above the support package) is not.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import support.rank_script  # noqa: E402
from support.rank_script import leave_without_teardown, rank_tag  # noqa: E402


def run_one(arg, scratch_root, batch_env):
    path, setting = arg, ""
    if arg.endswith("]"):
        path, setting = arg[:-1].split("[", 1)
        setting = "[%s]" % setting
    name = os.path.splitext(os.path.basename(path))[0] + setting
    start = time.monotonic()
    saved_env, saved_path, saved_argv = dict(os.environ), list(sys.path), list(sys.argv)
    scratch = os.path.join(scratch_root, name)
    os.makedirs(scratch, exist_ok=True)
    os.environ.update(batch_env.get(name, {}))  # putenv: the core's getenv() sees it
    os.environ["PTEST_TMPDIR"] = scratch
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    sys.argv = [path]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:], sys.argv = saved_path, saved_argv
    from perseus.common import basics  # loaded by the script already: no framework import
    if basics.is_initialized():
        basics.shutdown()
    # One write: the lines stay whole among the other ranks' output. The time on rank 0
    # only, inside the script's window (BatchJob.window ends at the END line).
    took = ""
    if rank_tag() == "[rank 0]":
        took = "%s BATCH TIME %s %.2f\n" % (rank_tag(), name, time.monotonic() - start)
    sys.stdout.flush()
    os.write(1, ("%s%s BATCH END %s\n" % (took, rank_tag(), name)).encode())


def main(args):
    scratch_root = os.environ["PTEST_TMPDIR"]
    batch_env = json.loads(os.environ.pop("PTEST_BATCH_ENV", "{}"))
    support.rank_script.IN_BATCH = True
    for arg in args:
        run_one(arg, scratch_root, batch_env)
    leave_without_teardown(0)  # as each script alone would (rank_script.main)


if __name__ == "__main__":
    main(sys.argv[1:])
