"""The TensorFlow front end, tested in its own venv (.venv-tf, made by
scripts/setup_tf.sh, which scripts/setup.sh runs): each script in tests/tensorflow/
runs under `mpirun -np 2` and `-np 4` with .venv-tf's python.

A missing .venv-tf fails these tests (CI must not silently drop them); set
PERSEUS_SKIP_TF=1 to skip them on purpose. PERSEUS_TF_PYTHON names another
interpreter with TensorFlow.
The examples in examples/tensorflow/ (TF2 GradientTape, Keras fit, TF1
MonitoredTrainingSession) run at np 2 and must reach the promised accuracy; the
Keras one also under Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1).
"""
import re
import subprocess

import pytest

from support.jobs import REPO_ROOT, TESTS_DIR, TF_ENV, clean_env, run_job, tf_python

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(420)]

TF_SCRIPTS = TESTS_DIR / "tensorflow"

SCRIPTS = [
    "collectives",  # every collective x dtype, eager and tf.function; gradients; errors
    "training",     # DistributedGradientTape, Keras fit, TF1 session + hook vs one process
    "accumulation",  # backward_passes_per_step (Keras, TF1), momentum correction vs references
    "adasum_optimizer",  # TF1 DistributedOptimizer(op=Adasum): delta optimizer vs a reference
    "parity",       # Horovod parity: names across retraces, gradient conventions, uint16, ...
    "keras_parity",  # BroadcastGlobalVariablesCallback(local_variables), PartialDistributedOptimizer
    "traced",       # tf.function path: no Python per call, in-place ops, bounded graph drive
]


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("script", SCRIPTS)
def test_tensorflow_script(run_mpi_batch, script, nprocs):
    # All of them in one job per np (tests/support/rank_batch.py): 4 ranks importing TensorFlow
    # take 10 s here. "traced" first: it sizes TensorFlow's thread pools, which only a
    # TensorFlow not yet started allows.
    batch = sorted(SCRIPTS, key=lambda s: s != "traced")
    run_mpi_batch(script, nprocs, batch, env=TF_ENV, timeout=300, python=tf_python(),
                  scripts_dir=TF_SCRIPTS)


# keras_parity first: tf-keras keeps state from one script to the next, and keras_parity
# failed after training and accumulation in one process (the other order passes).
KERAS2 = ["keras_parity", "training", "accumulation"]


@pytest.mark.parametrize("script", ["training", "accumulation", "keras_parity"])
def test_training_keras2(run_mpi_batch, script):
    """The scripts' Keras checks (and the rest) with Keras 2 (tf-keras), in one job
    (tests/support/rank_batch.py; a script it did not see through runs alone)."""
    run_mpi_batch(script, 2, KERAS2, env=dict(TF_ENV, TF_USE_LEGACY_KERAS="1"), timeout=360,
                  python=tf_python(), scripts_dir=TF_SCRIPTS)


@pytest.mark.parametrize("example,legacy_keras", [("tf2_digits", False),
                                                  ("keras_digits", False),
                                                  ("keras_digits", True),
                                                  ("tf1_digits", False)])
def test_example_two_ranks(example, legacy_keras, tmp_path):
    python = tf_python()
    env = dict(TF_ENV, TF_USE_LEGACY_KERAS="1") if legacy_keras else TF_ENV
    argv = [python, REPO_ROOT / "examples" / "tensorflow" / ("%s.py" % example)]
    if example == "tf1_digits":
        argv += ["--checkpoint-dir", tmp_path / "ckpt"]
    out = run_job(2, argv, env=env, timeout=240)
    final = re.search(r"^Final test accuracy: ([\d.]+)% on 2 rank\(s\)", out, re.M)
    assert final and float(final.group(1)) >= 95.0, out
    if example == "tf1_digits":  # rank 0 alone writes checkpoints
        assert (tmp_path / "ckpt" / "checkpoint").exists()


def _tf_subprocess(code, env, timeout=120):
    return subprocess.run([str(tf_python()), "-c", code], cwd=str(REPO_ROOT),
                          env=clean_env(dict(TF_ENV, **env)), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def test_single_process_without_mpirun():
    code = ("import tensorflow as tf, perseus.tensorflow.horovod as hvd\n"
            "hvd.init(); assert (hvd.rank(), hvd.size()) == (0, 1)\n"
            "assert hvd.allreduce(tf.constant([2.0])).numpy().tolist() == [2.0]\n"
            "assert tf.function(lambda t: hvd.allgather(t))(tf.ones([2, 1])).shape == (2, 1)\n"
            "hvd.shutdown(); print('single ok')\n")
    result = _tf_subprocess(code, {})
    assert result.returncode == 0 and "single ok" in result.stdout, result.stderr


def test_op_library_build_failure_is_clear(tmp_path):
    """No compiler: importing the TensorFlow front end says what failed and how to fix it."""
    result = _tf_subprocess("import perseus.tensorflow.horovod",
                            {"PERSEUS_TF_OPS_CACHE": str(tmp_path), "CXX": "/nonexistent/c++"})
    assert result.returncode != 0
    assert "cannot build the Perseus TensorFlow ops" in result.stderr, result.stderr
    assert "set CXX" in result.stderr, result.stderr


def test_synthetic_benchmark_two_ranks():
    out = run_job(2, [tf_python(), REPO_ROOT / "examples" / "tensorflow" /
                      "tensorflow2_synthetic_benchmark.py", "--model", "mlp", "--batch-size", "16",
                      "--num-warmup-batches", "2", "--num-batches-per-iter", "2", "--num-iters",
                      "2", "--num-threads", "1", "--fp16-allreduce"], env=TF_ENV, timeout=240)
    # Horovod's format, counting CPU ranks as "CPUs" (it said GPUs on a CPU run)
    assert "Model: mlp" in out and "Batch size: 16" in out and "Number of CPUs: 2" in out, out
    assert len(re.findall(r"^Iter #\d+: [\d.]+ img/sec per CPU$", out, re.M)) == 2, out
    assert re.search(r"^Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+$", out, re.M), out


def test_synthetic_benchmark_without_arguments_fits_a_cpu():
    """With no arguments it started ResNet-50 on the CPU and printed nothing for
    minutes; on a CPU it now takes the small CNN (seconds) and says so first."""
    out = run_job(1, [tf_python(), REPO_ROOT / "examples" / "tensorflow" /
                      "tensorflow2_synthetic_benchmark.py"], env=TF_ENV, timeout=120)
    assert out.startswith("Model: cnn\nBatch size: 32\nNumber of CPUs: 1\n"), out
    assert len(re.findall(r"^Iter #\d+: [\d.]+ img/sec per CPU$", out, re.M)) == 10, out


@pytest.mark.parametrize("legacy_keras", [False, True])
def test_momentum_correction_refuses_nesterov(legacy_keras):
    """Momentum correction scales the velocity (tests/tensorflow/accumulation.py checks
    the values); with Nesterov momentum that is not the scaled-momentum step, so the
    default momentum_correction=True is a clear error there; False trains."""
    code = ("import numpy as np, tensorflow as tf, perseus.tensorflow.keras as hvd\n"
            "hvd.init()\n"
            "def fit(correction, nesterov):\n"
            "    m = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])\n"
            "    m.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(\n"
            "        0.1, momentum=0.9, nesterov=nesterov)), loss='mse')\n"
            "    cb = hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1,\n"
            "        momentum_correction=correction, steps_per_epoch=2)\n"
            "    m.fit(np.ones((4, 2)), np.ones((4, 1)), batch_size=2, callbacks=[cb], verbose=0)\n"
            "fit(True, False)\n"
            "fit(False, True)\n"
            "try:\n"
            "    fit(True, True)\n"
            "except NotImplementedError as e:\n"
            "    assert 'momentum_correction=False' in str(e), e\n"
            "    print('refused ok')\n"
            "hvd.shutdown()\n")
    result = _tf_subprocess(code, {"TF_USE_LEGACY_KERAS": "1"} if legacy_keras else {})
    assert result.returncode == 0 and "refused ok" in result.stdout, result.stderr


def test_backward_passes_per_step_is_checked():
    code = ("import tensorflow as tf, perseus.tensorflow.keras as hvd\n"
            "import perseus.tensorflow.horovod as tfhvd\n"
            "for make in (lambda k: hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1),\n"
            "                                                backward_passes_per_step=k),\n"
            "             lambda k: tfhvd.DistributedOptimizer(\n"
            "                 tf.compat.v1.train.GradientDescentOptimizer(0.1),\n"
            "                 backward_passes_per_step=k)):\n"
            "    for bad in (0, 1.5):\n"
            "        try:\n"
            "            make(bad)\n"
            "        except ValueError as e:\n"
            "            assert 'backward_passes_per_step' in str(e), e\n"
            "        else:\n"
            "            raise AssertionError(bad)\n"
            "print('checked ok')\n")
    result = _tf_subprocess(code, {})
    assert result.returncode == 0 and "checked ok" in result.stdout, result.stderr
