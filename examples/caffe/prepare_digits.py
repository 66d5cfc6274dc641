"""Writes scikit-learn's digits (8x8 grey images, 10 classes) as HDF5 for Caffe's
HDF5Data layer: <out>/train.h5 and test.h5 (datasets `data`, N x 1 x 8 x 8 float32 in
[0, 1], and `label`, N float32), plus train.txt / test.txt, the list files the layer's
`source` names (absolute paths, so caffe can run from any directory).

    python examples/caffe/prepare_digits.py [--out examples/caffe/data]

The split (1437 train, 360 test) is a fixed permutation: every run writes the same
files, in the same row order (the data layer reads rows in order, rank r of N taking
rows r, r+N, ...).
"""
import argparse
from pathlib import Path

import h5py
import numpy as np
from sklearn.datasets import load_digits

TRAIN_ROWS = 1437


def digits_split():
    """(train_x, train_y, test_x, test_y) as the files hold them."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.float32)
    order = np.random.RandomState(0).permutation(len(y))
    x, y = x[order], y[order]
    return x[:TRAIN_ROWS], y[:TRAIN_ROWS], x[TRAIN_ROWS:], y[TRAIN_ROWS:]


def write(out, name, x, y):
    path = (out / ("%s.h5" % name)).resolve()
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=x)
        f.create_dataset("label", data=y)
    (out / ("%s.txt" % name)).write_text("%s\n" % path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"))
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    train_x, train_y, test_x, test_y = digits_split()
    write(out, "train", train_x, train_y)
    write(out, "test", test_x, test_y)
    print("wrote %d train and %d test digits to %s" % (len(train_y), len(test_y), out))


if __name__ == "__main__":
    main()
