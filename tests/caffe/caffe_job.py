"""Helpers for tests/frameworks/test_caffe.py: the patched Caffe build, prototxt files for small
jobs on scikit-learn's digits, `mpirun ... caffe train` with a hard timeout, and the
weights a job snapshots."""
import os
import re
import subprocess
from pathlib import Path

import h5py
import numpy as np

from support.jobs import REPO_ROOT, clean_env, find_mpirun, run_bounded

BUILD_SH = REPO_ROOT / "patches" / "bvlc_caffe" / "build.sh"
# Where build.sh builds (PERSEUS_CAFFE_CACHE, else a folder outside the checkout keyed by
# the patches and build.sh): build.sh says, so that one script knows the rule.
CACHE = Path(subprocess.run(["bash", str(BUILD_SH), "--cache-dir"], check=True, capture_output=True,
                            text=True, env=clean_env()).stdout.strip())
# The tool finds libperseus.so through its RUNPATH, made by whichever clone built the
# cached tool; LD_LIBRARY_PATH comes first, so each clone's jobs use this clone's core.
LIBRARY_PATH = str(REPO_ROOT / "perseus" / "lib")
PATCH = REPO_ROOT / "patches" / "bvlc_caffe" / "1_perseus_distribute_train.patch"
ORIG_TARBALL = CACHE / "dl" / "caffe_1.0.0+git20180821.99bd997.orig.tar.gz"
LENET = REPO_ROOT / "examples" / "caffe" / "lenet_digits.prototxt"
# The example's training data layer, which the jobs here point at their own rows.
LENET_TRAIN_DATA = 'source: "examples/caffe/data/train.txt" batch_size: 32'

# One inner product and a softmax loss: small enough for a numpy reference.
SOFTMAX_NET = """
name: "SoftmaxDigits"
layer { name: "digits" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param { source: "%(source)s" batch_size: %(batch)d } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 10
          weight_filler { type: "gaussian" std: 0.1 }
          bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

# Plain SGD with momentum and weight decay: deterministic (no dropout, no shuffling),
# one snapshot (HDF5) after the last iteration.
SOLVER = """
net: "%(net)s"
base_lr: %(lr)r
momentum: %(momentum)r
weight_decay: %(weight_decay)r
lr_policy: "fixed"
max_iter: %(iters)d
display: 0
snapshot_prefix: "%(prefix)s"
snapshot_format: HDF5
random_seed: %(seed)d
solver_mode: CPU
"""


def write_rows(directory, x, y):
    """HDF5 rows for the HDF5Data layer -> the list file its `source` names."""
    directory.mkdir(parents=True, exist_ok=True)
    h5 = directory / "rows.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset("data", data=x.astype(np.float32))
        f.create_dataset("label", data=y.astype(np.float32))
    source = directory / "rows.txt"
    source.write_text("%s\n" % h5)
    return source


def lenet_net(source, batch):
    """The example's LeNet, its training layer reading `source` in batches of `batch`."""
    text = LENET.read_text()
    assert LENET_TRAIN_DATA in text, "the example's data layer changed; update LENET_TRAIN_DATA"
    return text.replace(LENET_TRAIN_DATA, 'source: "%s" batch_size: %d' % (source, batch))


def softmax_net(source, batch):
    return SOFTMAX_NET % dict(source=source, batch=batch)


def write_job(directory, net_text, iters, lr=0.1, momentum=0.9, weight_decay=0.001, seed=7):
    """Writes net.prototxt and solver.prototxt -> (solver path, snapshot path)."""
    directory.mkdir(parents=True, exist_ok=True)
    net = directory / "net.prototxt"
    net.write_text(net_text)
    solver = directory / "solver.prototxt"
    solver.write_text(SOLVER % dict(net=net, lr=lr, momentum=momentum, iters=iters,
                                    weight_decay=weight_decay, prefix=directory / "snap",
                                    seed=seed))
    return solver, directory / ("snap_iter_%d.caffemodel.h5" % iters)


def snapshot_weights(path):
    """{layer name: [param arrays]} from an HDF5 caffemodel."""
    with h5py.File(path, "r") as f:
        return {layer: [np.array(f["data"][layer][str(i)]) for i in range(len(f["data"][layer]))]
                for layer in f["data"] if len(f["data"][layer])}


def run_caffe(caffe, np_or_blocks, args=(), env=None, timeout=120, check=True):
    """`mpirun -np N caffe train <args>` -> (returncode, stdout, stderr); np_or_blocks may
    instead be a list of (np, {VAR: value}, args) blocks for an MPMD launch where ranks
    differ. A job outliving `timeout` is killed and fails the test: a hang never stalls
    the suite. check: fail the test on a non-zero exit."""
    blocks = np_or_blocks if isinstance(np_or_blocks, list) else [(np_or_blocks, {}, args)]
    cmd = [find_mpirun()]
    for i, (n, block_env, block_args) in enumerate(blocks):
        cmd += [":"] if i else []
        cmd += ["-np", str(n)]
        for key, value in block_env.items():
            cmd += ["-env", key, value]
        cmd += [str(caffe), "train"] + [str(a) for a in block_args]
    # glog to stderr, so each rank's messages are in the job's output.
    job_env = clean_env(dict({"GLOG_logtostderr": "1", "GLOG_minloglevel": "0",
                              "LD_LIBRARY_PATH": LIBRARY_PATH}, **(env or {})))
    code, out, err, seconds = run_bounded(cmd, job_env, timeout)
    if check and code != 0:
        raise AssertionError("caffe job exited %d after %.0f s\ncommand: %s\n----- stdout -----\n"
                             "%s\n----- stderr -----\n%s" % (code, seconds, " ".join(map(str, cmd)),
                                                             out, err[-6000:]))
    return code, out, err


def printed_accuracies(log):
    """The `accuracy` values rank 0 printed for each test pass."""
    return [float(v) for v in re.findall(r"Test net output #\d+: accuracy = ([0-9.]+)", log)]
