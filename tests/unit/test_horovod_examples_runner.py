"""scripts/run_horovod_examples.py without Horovod's examples: its import rewriting, and
the synthetic datasets it writes, read back with independent parsers."""
import pickle
import struct
import sys
import zipfile

import numpy as np
import pytest

from support.jobs import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import horovod_examples_data as data  # noqa: E402
import run_horovod_examples as runner  # noqa: E402


@pytest.mark.parametrize("line, expected", [
    ("import horovod.torch as hvd", "import perseus.torch.horovod as hvd"),
    ("import horovod.tensorflow as hvd", "import perseus.tensorflow.horovod as hvd"),
    ("import horovod.tensorflow.keras as hvd", "import perseus.tensorflow.keras as hvd"),
    ("import horovod.keras as hvd", "import perseus.keras as hvd"),
    ("import horovod.mxnet as hvd", "import perseus.mxnet as hvd"),
    ("import horovod", "import perseus as horovod"),
    ("    import horovod.torch as hvd  # pin", "    import perseus.torch.horovod as hvd  # pin"),
    ("from horovod.torch.mpi_ops import synchronize, Average",
     "from perseus.torch.horovod.mpi_ops import synchronize, Average"),
    ("from horovod.tensorflow.keras import callbacks",
     "from perseus.tensorflow.keras import callbacks"),
])
def test_import_lines_rewritten(line, expected):
    assert runner.rewrite_imports(line + "\n") == (expected + "\n", 1)


def test_other_lines_untouched():
    source = ("import horovod_extra as x\n"
              "print('import horovod.torch as hvd')\n"
              "x = horovod.run\n"
              "import torch\n")
    assert runner.rewrite_imports(source) == (source, 0)


def test_import_without_alias_refused():
    with pytest.raises(ValueError, match="without an alias"):
        runner.rewrite_imports("import horovod.torch\n")


def read_idx(raw):
    """An idx file (MNIST) -> array: 2 zero bytes, type 0x08 (uint8), rank, sizes."""
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    assert (zero, dtype) == (0, 0x08)
    shape = struct.unpack(">%dI" % ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw[4 + 4 * ndim:], dtype=np.uint8).reshape(shape)


def nearest_mean_accuracy(x_train, y_train, x_test, y_test):
    """Test accuracy of classifying by the nearest training-class mean: near 1.0 only if
    training and test images of a class look alike (the examples' accuracy checks)."""
    x_train = x_train.reshape(len(x_train), -1).astype(float)
    x_test = x_test.reshape(len(x_test), -1).astype(float)
    means = np.stack([x_train[y_train == k].mean(0) for k in range(data.NUM_CLASSES)])
    guess = ((x_test[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    return (guess == y_test).mean()


def test_torchvision_mnist_files(tmp_path):
    data.write_torchvision_mnist(tmp_path, train=200, test=50)
    raw = tmp_path / "MNIST" / "raw"
    x_train, y_train, x_test, y_test = (read_idx((raw / name).read_bytes())
                                        for name in data.MNIST_FILES)
    assert x_train.shape == (200, 28, 28) and x_test.shape == (50, 28, 28)
    assert y_train.shape == (200,) and set(y_train) == set(range(10))
    assert nearest_mean_accuracy(x_train, y_train, x_test, y_test) == 1.0


def test_mxnet_mnist_zip(tmp_path):
    path = tmp_path / "data-0" / "mnist.zip"
    data.write_mxnet_mnist_zip(str(path), train=100, test=20)
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == sorted(data.MNIST_FILES)
        assert read_idx(zf.read("t10k-images-idx3-ubyte")).shape == (20, 28, 28)


def test_keras_mnist_npz(tmp_path):
    path = tmp_path / "mnist-1.npz"
    data.write_keras_mnist(str(path), train=100, test=30, side=8)
    with np.load(path) as f:
        assert f["x_train"].shape == (100, 8, 8) and f["x_train"].dtype == np.uint8
        assert f["y_test"].shape == (30,)
        assert nearest_mean_accuracy(f["x_train"], f["y_train"], f["x_test"], f["y_test"]) == 1.0


def test_cifar10_batches(tmp_path):
    data.write_cifar10(tmp_path, train=20, test=10)
    folder = tmp_path / "cifar-10-batches-py"
    rows = 0
    for i in range(1, 6):
        with open(folder / ("data_batch_%d" % i), "rb") as f:
            batch = pickle.load(f, encoding="latin1")  # as torchvision reads them
        assert batch["data"].shape[1] == 3072 and len(batch["labels"]) == len(batch["data"])
        rows += len(batch["data"])
    assert rows == 20
    with open(folder / "batches.meta", "rb") as f:
        assert len(pickle.load(f)["label_names"]) == 10


def test_mxnet_recordio(tmp_path):
    pytest.importorskip("PIL")
    prefix = str(tmp_path / "train")
    data.write_mxnet_rec(prefix, count=3, classes=2)
    rec = open(prefix + ".rec", "rb").read()
    offsets = [int(line.split("\t")[1]) for line in open(prefix + ".idx")]
    assert len(offsets) == 3
    for i, offset in enumerate(offsets):
        magic, length = struct.unpack("<II", rec[offset:offset + 8])
        assert magic == 0xCED7230A and length >> 29 == 0
        flag, label, ident, _ = struct.unpack("<IfQQ", rec[offset + 8:offset + 32])
        assert (flag, ident) == (0, i) and label in (0.0, 1.0)
        assert rec[offset + 32:offset + 34] == b"\xff\xd8"  # a JPEG follows
    assert offsets[-1] + 8 + length + (-length % 4) == len(rec)


def test_every_example_has_a_known_front_end_and_preparer():
    for example in runner.EXAMPLES:
        assert example.front in runner.FRONT_ENDS, example.name
        assert not example.data or example.data[0] in runner.PREPARERS, example.name
    assert runner.skip_reason("spark/keras/keras_spark_mnist.py")
    assert runner.skip_reason("pytorch/pytorch_mnist.py") is None
