"""Short snippets that each call init() under variables of their own, in ONE fresh
process instead of one process each (issue 50: a process start and a torch import,
about 1.5 s, per case). The core reads its settings at every init() (LoadConfig), so a
case run after others sees its own variables as a fresh process would; a case whose
result would differ there fails its test, and a case the process did not finish (it
crashed or hung) runs alone, where its own report is the test's.

    results = init_batch.run({"name": (env, code), ...})
    results["name"]  # a CompletedProcess: returncode (the snippet's sys.exit code),
                     # stdout (its output and the core's, stderr included), stderr ""

Each snippet runs from a clean environment (support.jobs.clean_env) plus its `env`;
after it, the runner shuts down whatever front end it left initialised.
"""
import json
import subprocess
import sys
import tempfile

from support.jobs import REPO_ROOT, clean_env

_RUNNER = r'''
import json, os, sys, traceback
with open(sys.argv[1]) as f:
    cases = json.load(f)
base = dict(os.environ)
for name, env, code in cases:
    os.environ.clear()
    os.environ.update(base)
    os.environ.update(env)
    print("\nCASE BEGIN %s" % name, flush=True)
    code_rc = 0
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        code_rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        code_rc = 1
    hvd = sys.modules.get("perseus.torch.horovod")
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    print("\nCASE END %s %d" % (name, code_rc), flush=True)
'''


def _alone(env, code, timeout):
    try:
        return subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), env=clean_env(env),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, 124, "timed out after %d s\n%s" % (timeout, e.stdout or ""),
                                           e.stderr or "")


def run(cases, timeout=120):
    """{name: (env, code)} -> {name: CompletedProcess}, the cases run in turn in one process."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([[name, env, code] for name, (env, code) in cases.items()], f)
    try:
        done = subprocess.run([sys.executable, "-c", _RUNNER, f.name], cwd=str(REPO_ROOT), env=clean_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout * len(cases)).stdout
    except subprocess.TimeoutExpired as e:
        done = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    results = {}
    for name, (env, code) in cases.items():
        begin, end = "\nCASE BEGIN %s\n" % name, "\nCASE END %s " % name
        if begin in done and end in done.split(begin, 1)[1]:
            window, rest = done.split(begin, 1)[1].split(end, 1)
            results[name] = subprocess.CompletedProcess(name, int(rest.split("\n", 1)[0]), window, "")
        else:  # the process did not get through it: alone, its own report
            results[name] = _alone(env, code, timeout)
    return results
