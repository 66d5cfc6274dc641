#!/usr/bin/env python3
"""Run Horovod's own examples on Perseus with only their import lines changed.

    python scripts/run_horovod_examples.py --examples <horovod checkout>/examples [--only NAME]

Each example in EXAMPLES is copied to a temporary directory with its `horovod` imports
rewritten by IMPORTS (nothing else changes), given small synthetic data where it would
download (scripts/horovod_examples_data.py), and run under `mpirun -np 2` with its front
end's python and small arguments. Prints one row per example (passed / failed / skipped
and why, seconds) and exits 1 if any failed. Horovod's examples are not in this repository.

Pythons: torch -> this interpreter; tf -> $PERSEUS_TF_PYTHON or .venv-tf; mx ->
$PERSEUS_MX_PYTHON or .venv-mx (as tests/conftest.py). --path FRONT=DIR adds DIR to that
front end's PYTHONPATH (e.g. a torchvision or gluoncv installed with pip --target).
"""
import argparse
import fnmatch
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
REPO_ROOT = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))
import horovod_examples_data as data  # noqa: E402

# Horovod module -> Perseus module; the longest matching prefix wins. `import horovod`
# becomes `import perseus as horovod`.
IMPORTS = {
    "horovod.torch": "perseus.torch.horovod",
    "horovod.tensorflow.keras": "perseus.tensorflow.keras",
    "horovod.tensorflow": "perseus.tensorflow.horovod",
    "horovod.keras": "perseus.keras",
    "horovod.mxnet": "perseus.mxnet",
    "horovod": "perseus",
}

# Front end -> (its python: torch, tf or mx; environment of its runs). Horovod 0.28's
# TensorFlow examples are written for Keras 2 (opt.variables(), compile(
# experimental_run_tf_function=...), optimizers.legacy), which TensorFlow 2.21 provides as
# tf_keras; "tf-keras3" runs them under Keras 3, TensorFlow's default.
FRONT_ENDS = {"torch": ("torch", {}), "tf": ("tf", {"TF_USE_LEGACY_KERAS": "1"}),
              "tf-keras3": ("tf", {}), "mx": ("mx", {})}

TF1_ONLY = (r"has no attribute 'ConfigProto'",
            "Horovod's example is TF1 code (tf.ConfigProto, tf.Session): TensorFlow 2 has "
            "neither, so it stops there under Horovod too")


@dataclass
class Example:
    path: str                   # under the examples directory
    front: str                  # key of FRONT_ENDS
    args: list = field(default_factory=list)  # "{work}": its directory, "{np}": --np
    data: tuple = ()            # (key of PREPARERS, folder under {work}, its kwargs)
    expect: str = ""            # regex the output must contain (the example got to its end)
    upstream: tuple = ()        # (regex, why): a failure Horovod's example has anyway
    timeout: int = 0            # seconds; 0 -> --timeout
    variant: str = ""           # a second run of the same example: its name in the table
    launch: str = "mpirun"      # "python": the example starts its ranks (horovod.run)

    @property
    def name(self):
        return "%s (%s)" % (self.path, self.variant) if self.variant else self.path


SMALL_BENCH = ["--num-warmup-batches", "1", "--num-batches-per-iter", "1", "--num-iters", "2"]
EXAMPLES = [
    Example("pytorch/pytorch_allreduce.py", "torch", expect=r"process is 1 and tensor is"),
    Example("pytorch/pytorch_synthetic_benchmark.py", "torch",
            ["--no-cuda", "--batch-size", "2"] + SMALL_BENCH,
            expect=r"Total img/sec on 2 CPU\(s\)"),
    Example("pytorch/pytorch_synthetic_benchmark.py", "torch",
            ["--no-cuda", "--batch-size", "2", "--model", "resnet18", "--fp16-allreduce",
             "--use-adasum"] + SMALL_BENCH,
            expect=r"Total img/sec on 2 CPU\(s\)", variant="fp16, Adasum"),
    Example("pytorch/pytorch_mnist.py", "torch",
            ["--no-cuda", "--epochs", "1", "--test-batch-size", "256", "--data-dir", "{work}/data"],
            data=("write_torchvision_mnist", "data", {}), expect=r"Test set: Average loss"),
    Example("pytorch/pytorch_mnist.py", "torch",
            ["--no-cuda", "--epochs", "1", "--test-batch-size", "256", "--data-dir", "{work}/data",
             "--gradient-predivide-factor", "2"],
            data=("write_torchvision_mnist", "data", {}), expect=r"Test set: Average loss",
            variant="predivide 2"),
    Example("pytorch/pytorch_mnist.py", "torch",
            ["--no-cuda", "--epochs", "1", "--test-batch-size", "256", "--data-dir", "{work}/data",
             "--num-proc", "{np}"],
            data=("write_torchvision_mnist", "data", {}), expect=r"Test set: Average loss",
            variant="--num-proc: horovod.run", launch="python"),
    Example("pytorch/pytorch_imagenet_resnet50.py", "torch",
            ["--no-cuda", "--epochs", "1", "--batch-size", "2", "--val-batch-size", "2",
             "--train-dir", "{work}/imagenet/train", "--val-dir", "{work}/imagenet/validation"],
            data=("write_imagenet_folders", "imagenet", {}), expect=r"Validate Epoch  #1"),
    Example("pytorch/pytorch_imagenet_resnet50.py", "torch",
            ["--no-cuda", "--epochs", "1", "--batch-size", "1", "--val-batch-size", "2",
             "--batches-per-allreduce", "2", "--train-dir", "{work}/imagenet/train",
             "--val-dir", "{work}/imagenet/validation"],
            data=("write_imagenet_folders", "imagenet", {}), expect=r"Validate Epoch  #1",
            variant="2 batches per allreduce"),
    Example("pytorch/pytorch_cifar10.py", "torch", ["--no-cuda", "--epochs", "1"],
            data=("write_cifar10", "data", {}), expect=r"Validate Epoch  #1"),
    Example("tensorflow2/tensorflow2_synthetic_benchmark.py", "tf",
            ["--no-cuda", "--batch-size", "2"] + SMALL_BENCH,
            expect=r"Total img/sec on 2 CPU\(s\)"),
    Example("tensorflow2/tensorflow2_keras_synthetic_benchmark.py", "tf",
            ["--no-cuda", "--batch-size", "2", "--num-batches-per-iter", "1", "--num-iters", "2"],
            expect=r"Total img/sec on 2 CPU\(s\)"),
    Example("tensorflow2/tensorflow2_synthetic_benchmark.py", "tf-keras3",
            ["--no-cuda", "--batch-size", "2"] + SMALL_BENCH, variant="Keras 3",
            upstream=(r"'list' object is not callable",
                      "the example calls opt.variables(), a list in Keras 3")),
    Example("tensorflow2/tensorflow2_keras_synthetic_benchmark.py", "tf-keras3",
            ["--no-cuda", "--batch-size", "2", "--num-batches-per-iter", "1", "--num-iters", "2"],
            variant="Keras 3",
            upstream=(r"unexpected keyword argument 'experimental_run_tf_function'",
                      "the example passes compile(experimental_run_tf_function=False), which "
                      "Keras 3 does not take")),
    # These two fix their step counts (5000 and 24 x 250 steps of 128 images): 8 x 8
    # images keep that short on CPUs.
    Example("tensorflow2/tensorflow2_mnist.py", "tf",
            data=("write_keras_mnist_per_rank", "home/.keras/datasets", {"side": 8}),
            expect=r"Step #4990\tLoss"),
    Example("tensorflow2/tensorflow2_keras_mnist.py", "tf",
            data=("write_keras_mnist_per_rank", "home/.keras/datasets", {"side": 8}),
            expect=r"Epoch 24/24",
            upstream=(r"has no attribute '__version__'",
                      "the example reads tf.keras.__version__, which tf_keras's tf.keras lacks; "
                      "under Keras 3 it needs keras.optimizers.legacy, which Keras 3 refuses")),
    Example("keras/keras_mnist.py", "tf", data=("write_keras_mnist", "home/.keras/datasets", {}),
            upstream=TF1_ONLY),
    Example("keras/keras_mnist_advanced.py", "tf", ["--epochs", "1"],
            data=("write_keras_mnist", "home/.keras/datasets", {}),
            upstream=(r"cannot import name 'ImageDataGenerator'|has no attribute 'ConfigProto'",
                      TF1_ONLY[1] + "; Keras 3 also dropped keras.preprocessing.image")),
    Example("mxnet/mxnet_mnist.py", "mx", ["--epochs", "2", "--no-cuda"],
            data=("write_mxnet_mnist_per_rank", ".", {}), expect=r"Epoch\[1\]\tTrain: accuracy="),
    Example("mxnet/mxnet_mnist.py", "mx",
            ["--epochs", "2", "--no-cuda", "--fp16-allreduce", "--gradient-predivide-factor", "2"],
            data=("write_mxnet_mnist_per_rank", ".", {}), expect=r"Epoch\[1\]\tTrain: accuracy=",
            variant="fp16, predivide 2"),
    # The ranks log nothing (logging is set up under the script's __main__ guard, which
    # horovod.run's ranks skip, as Horovod's do); rank 0 still asserts the accuracy.
    Example("mxnet/mxnet_mnist.py", "mx", ["--epochs", "2", "--no-cuda", "--num-proc", "{np}"],
            data=("write_mxnet_mnist_per_rank", ".", {}),
            variant="--num-proc: horovod.run", launch="python"),
    Example("mxnet/mxnet2_mnist.py", "mx", ["--epochs", "1", "--no-cuda"],
            data=("write_mxnet_mnist_per_rank", ".", {}),
            upstream=(r"module 'mxnet.gluon' has no attribute 'metric'",
                      "an MXNet 2 example (mx.gluon.metric); MXNet 1.9.1 has mx.metric")),
    # The synthetic mode trains a full ImageNet epoch (1,281,167 images: a constant of the
    # example), far beyond CPUs; --use-rec with a small RecordIO file runs the same training.
    Example("mxnet/mxnet_imagenet_resnet50.py", "mx",
            ["--use-rec", "--rec-train", "{work}/train.rec", "--rec-train-idx", "{work}/train.idx",
             "--rec-val", "{work}/val.rec", "--rec-val-idx", "{work}/val.idx", "--batch-size", "2",
             "--num-epochs", "1", "--no-cuda", "--data-nthreads", "1", "--mode", "module"],
            data=("write_mxnet_recs", ".", {}), expect=r"Validation-top_k_accuracy_5=",
            variant="module"),
    Example("mxnet/mxnet_imagenet_resnet50.py", "mx",
            ["--use-rec", "--rec-train", "{work}/train.rec", "--rec-train-idx", "{work}/train.idx",
             "--rec-val", "{work}/val.rec", "--rec-val-idx", "{work}/val.idx", "--batch-size", "2",
             "--num-epochs", "1", "--no-cuda", "--data-nthreads", "1", "--mode", "gluon",
             "--log-interval", "1"],
            data=("write_mxnet_recs", ".", {}), expect=r"Validation-top_k_accuracy_5=",
            variant="gluon"),
]

# Examples not run: (pattern under the examples directory, why).
SKIPPED = [
    ("spark/*", "needs Apache Spark (horovod.spark); Perseus has no Spark integration"),
    ("ray/*", "needs Ray (horovod.ray); Perseus has no Ray integration"),
    ("*lightning*", "PyTorch Lightning's Horovod strategy imports horovod itself"),
    ("elastic/*", "needs horovodrun's elastic driver (--min-np/--max-np, host discovery); "
                  "Perseus runs under mpirun"),
    ("*data_service*", "needs horovod.tensorflow.data's tf.data service, which Perseus lacks"),
]


def write_imagenet_folders(root):
    for split, per_class in (("train", 4), ("validation", 2)):
        data.write_image_folder(os.path.join(root, split), per_class=per_class)


def write_mxnet_recs(root):
    data.write_mxnet_rec(os.path.join(root, "train"), count=8)
    data.write_mxnet_rec(os.path.join(root, "val"), count=4)


def write_keras_mnist_per_rank(root, np_=2, **kwargs):
    for rank in range(np_):
        data.write_keras_mnist(os.path.join(root, "mnist-%d.npz" % rank), **kwargs)


def write_mxnet_mnist_per_rank(root, np_=2):
    for rank in range(np_):
        data.write_mxnet_mnist_zip(os.path.join(root, "data-%d" % rank, "mnist.zip"))


PREPARERS = {
    "write_torchvision_mnist": data.write_torchvision_mnist,
    "write_cifar10": data.write_cifar10,
    "write_imagenet_folders": write_imagenet_folders,
    "write_keras_mnist": lambda root, **kw: data.write_keras_mnist(
        os.path.join(root, "mnist.npz"), **kw),
    "write_keras_mnist_per_rank": write_keras_mnist_per_rank,
    "write_mxnet_mnist_per_rank": write_mxnet_mnist_per_rank,
    "write_mxnet_recs": write_mxnet_recs,
}
PER_RANK = {"write_keras_mnist_per_rank", "write_mxnet_mnist_per_rank"}

_IMPORT_LINE = re.compile(
    r"^(?P<indent>\s*)(?:import\s+(?P<imported>horovod(?:\.\w+)*)(?:\s+as\s+(?P<alias>\w+))?"
    r"|from\s+(?P<source>horovod(?:\.\w+)*)\s+import\s+(?P<names>[^#]*?))"
    r"\s*(?P<comment>#.*)?$")


def perseus_module(module):
    """The Perseus module for a Horovod module path (longest matching prefix of IMPORTS)."""
    for horovod in sorted(IMPORTS, key=len, reverse=True):
        if module == horovod or module.startswith(horovod + "."):
            return IMPORTS[horovod] + module[len(horovod):]
    raise ValueError("not a horovod module: %s" % module)


def rewrite_imports(source):
    """The source with each `import horovod...` / `from horovod... import` line rewritten
    by IMPORTS -> (new source, number of lines changed). `import horovod.x` without `as`
    would bind `horovod`, which the rewrite cannot keep: ValueError."""
    lines, changed = [], 0
    for line in source.splitlines(keepends=True):
        m = _IMPORT_LINE.match(line.rstrip("\r\n"))
        if m:
            if m.group("source"):
                statement = "from %s import %s" % (perseus_module(m.group("source")),
                                                   m.group("names"))
            elif m.group("alias"):
                statement = "import %s as %s" % (perseus_module(m.group("imported")),
                                                 m.group("alias"))
            elif m.group("imported") == "horovod":
                statement = "import perseus as horovod"
            else:
                raise ValueError("cannot rewrite %r without an alias" % line.strip())
            comment = "  " + m.group("comment") if m.group("comment") else ""
            line = m.group("indent") + statement + comment + "\n"
            changed += 1
        lines.append(line)
    return "".join(lines), changed


def prepare_data(example, work, np_):
    if not example.data:
        return
    name, where, kwargs = example.data
    root = os.path.join(work, where)
    os.makedirs(root, exist_ok=True)
    if name in PER_RANK:
        kwargs = dict(kwargs, np_=np_)
    PREPARERS[name](root, **kwargs)


def skip_reason(path):
    for pattern, why in SKIPPED:
        if fnmatch.fnmatch(path, pattern):
            return why
    return None


def child_env(front, work, paths, extra):
    """The environment of one run: no launcher state from ours, PYTHONPATH = the site
    workarounds, this checkout, the front end's extra paths; HOME inside the run's
    directory (Keras's dataset cache, Horovod's lock file), caches kept where they were."""
    from perseus.common.launch_check import LAUNCHER_STATE_PREFIXES
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_STATE_PREFIXES)}
    env.setdefault("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    env.update({
        "HOME": os.path.join(work, "home"),
        "PYTHONPATH": os.pathsep.join([str(SCRIPTS / "horovod_examples_site"), str(REPO_ROOT)]
                                      + paths + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        "PERSEUS_EXAMPLES_DATA": work,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(FRONT_ENDS[front][1])
    env.update(extra)
    os.makedirs(env["HOME"], exist_ok=True)
    return env


def run_bounded(cmd, cwd, env, timeout):
    """-> (exit code or None on timeout, output); a timeout kills the whole job."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out.decode(errors="replace")


@functools.lru_cache(maxsize=None)
def torchvision_needs_schemas(python, paths):
    """True when torchvision is there but fails to import for lack of its C++ ops."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(list(paths) + [str(REPO_ROOT)]))
    probe = subprocess.run([python, "-c", "import torchvision"], env=env,
                           capture_output=True, text=True)
    return probe.returncode != 0 and "torchvision::nms" in probe.stderr


def run_example(example, opts, pythons, paths, mpirun, scratch):
    """-> (result, why, seconds)."""
    source = Path(opts.examples) / example.path
    if not source.exists():
        return "skipped", "not in %s" % opts.examples, 0.0
    python = pythons[FRONT_ENDS[example.front][0]]
    if not os.path.exists(python):
        return "failed", "no python %s (see --python)" % python, 0.0
    work = os.path.join(scratch, re.sub(r"\W+", "_", example.name.split("/", 1)[-1]).strip("_"))
    os.makedirs(work)
    text, changed = rewrite_imports(source.read_text())
    script = os.path.join(work, source.name)
    Path(script).write_text(text)
    prepare_data(example, work, opts.np)
    extra = {"PERSEUS_MPIRUN": mpirun}  # for horovod.run: the MPI Perseus was built with
    if example.front == "torch" and torchvision_needs_schemas(python, tuple(paths["torch"])):
        extra["PERSEUS_EXAMPLES_TORCHVISION_SCHEMAS"] = "1"
    env = child_env(example.front, work, paths[FRONT_ENDS[example.front][0]], extra)
    args = [a.replace("{work}", work).replace("{np}", str(opts.np)) for a in example.args]
    cmd = [python, script] + args
    if example.launch == "mpirun":
        cmd = [mpirun, "-np", str(opts.np)] + cmd
    start = time.monotonic()
    code, out = run_bounded(cmd, work, env, example.timeout or opts.timeout)
    seconds = time.monotonic() - start
    Path(work, "output.txt").write_text(out)
    if example.upstream and code != 0 and re.search(example.upstream[0], out):
        return "skipped", "ran: " + example.upstream[1], seconds
    if code is None:
        return "failed", "timed out after %d s" % (example.timeout or opts.timeout), seconds
    if code != 0:
        return "failed", "exit %d: %s" % (code, last_error(out)), seconds
    if example.expect and not re.search(example.expect, out):
        return "failed", "exit 0 but no %r in its output" % example.expect, seconds
    return "passed", "%d import line(s) changed" % changed, seconds


def last_error(out):
    """The last line that looks like an exception, else the last line."""
    lines = [l.strip() for l in out.splitlines() if l.strip()]
    errors = [l for l in lines if re.match(r"^\w+(\.\w+)*(Error|Exception)\b", l)]
    return (errors or lines or ["no output"])[-1][:300]


def default_pythons():
    def venv(tag):
        return os.environ.get("PERSEUS_%s_PYTHON" % tag.upper()) or str(
            REPO_ROOT / (".venv-%s" % tag) / "bin" / "python")
    return {"torch": sys.executable, "tf": venv("tf"), "mx": venv("mx")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", required=True,
                        help="the examples/ directory of a Horovod checkout")
    parser.add_argument("--only", action="append", default=[],
                        help="run only examples whose path contains this (repeatable)")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per example")
    parser.add_argument("--python", action="append", default=[], metavar="FRONT=PYTHON",
                        help="the python of a front end (torch, tf, mx)")
    parser.add_argument("--path", action="append", default=[], metavar="FRONT=DIR",
                        help="add DIR to a front end's PYTHONPATH (repeatable)")
    parser.add_argument("--keep", metavar="DIR",
                        help="run in DIR and keep each example's copy, data and output.txt")
    opts = parser.parse_args(argv)

    pythons = default_pythons()
    pythons.update(dict(p.split("=", 1) for p in opts.python))
    paths = {python: [] for python, _ in FRONT_ENDS.values()}
    for p in opts.path:
        front, folder = p.split("=", 1)
        paths[front].append(os.path.abspath(folder))
    from perseus import launcher
    mpirun = launcher.find_mpirun()

    scratch = opts.keep or tempfile.mkdtemp(prefix="horovod-examples-")
    os.makedirs(scratch, exist_ok=True)
    rows = []
    try:
        for example in EXAMPLES:
            if opts.only and not any(o in example.name for o in opts.only):
                continue
            result, why, seconds = run_example(example, opts, pythons, paths, mpirun, scratch)
            rows.append((example.name, example.front, result, why, seconds))
            print("%-55s %-5s %-7s %6.1f s  %s" % (example.name, example.front, result, seconds, why),
                  flush=True)
        listed = {e.path for e in EXAMPLES}
        for source in sorted(Path(opts.examples).rglob("*.py")):
            rel = source.relative_to(opts.examples).as_posix()
            why = skip_reason(rel)
            if rel not in listed and why and not opts.only:
                rows.append((rel, "-", "skipped", why, 0.0))
    finally:
        if not opts.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    print("\n| example | front end | result | seconds | why |\n|---|---|---|---|---|")
    for path, front, result, why, seconds in rows:
        print("| %s | %s | %s | %.0f | %s |" % (path, front, result, seconds, why))
    return 1 if any(r[2] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
