"""Keras model.fit throughput with Perseus' DistributedOptimizer at 1 and 2 ranks,
and the scaling efficiency throughput(np=2) / (2 x throughput(np=1)), in one run.

    .venv/bin/python benchmarks/keras_scaling.py [--repeat 3] [--steps 60]

The driver launches `mpirun -np N .venv-tf/bin/python this_file --worker` for N = 1, 2
in turn, `--repeat` times, one TensorFlow thread per rank. Each rank fits a small
convnet on synthetic 32x32x3 images (`--batch-size` per rank); a callback times the
steps after the first epoch's warm-up. The table shows medians; efficiency is the
median of the per-repeat ratios (each repeat's two runs sat close together in time).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import perseus.tensorflow.keras as hvd
    hvd.init()
    keras = tf.keras
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(hvd.rank())
    n = args.batch_size * args.steps
    x = rng.standard_normal((n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, n)

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.start

    timer = Timer()
    model.fit(x, y, batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # warm-up
    model.fit(x, y, batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False,
              callbacks=[timer])
    if hvd.rank() == 0:
        rate = n * hvd.size() / timer.seconds
        print("RESULT " + json.dumps({"np": hvd.size(), "samples_per_s": rate}), flush=True)
    hvd.shutdown()


def run_one(nprocs, args):
    python = REPO / ".venv-tf" / "bin" / "python"
    mpirun = Path(sys.executable).parent / "mpirun"
    cmd = [str(mpirun if mpirun.exists() else "mpirun"), "-np", str(nprocs), str(python),
           str(HERE), "--worker", "--batch-size", str(args.batch_size), "--steps", str(args.steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])["samples_per_s"]
    raise SystemExit("np=%d failed:\n%s\n%s" % (nprocs, out.stdout, out.stderr[-3000:]))


def driver(args):
    rates = {1: [], 2: []}
    for _ in range(args.repeat):
        for n in (1, 2):
            rates[n].append(run_one(n, args))
    eff = statistics.median(t / (2 * o) for o, t in zip(rates[1], rates[2]))
    print("Keras fit, small convnet, batch %d per rank, %d steps, %d repeats, 1 thread per rank\n"
          % (args.batch_size, args.steps, args.repeat))
    print("| np=1 samples/s | np=2 samples/s | scaling efficiency |")
    print("|---:|---:|---:|")
    print("| %.0f | %.0f | %.3f |" % (statistics.median(rates[1]), statistics.median(rates[2]), eff))
    print("\nper repeat: np=1 %s, np=2 %s" % (["%.0f" % r for r in rates[1]],
                                             ["%.0f" % r for r in rates[2]]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--steps", type=int, default=60, help="timed steps per rank")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
