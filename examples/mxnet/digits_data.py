"""scikit-learn's digits for the MXNet examples: a fixed train/test split, and this
rank's shard of the training set (every rank sees a disjoint part)."""

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def load(rank, size, seed=42):
    """(x_shard, y_shard, x_test, y_test) as float32 features in [0, 1]."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed,
                                                        stratify=y)
    return x_train[rank::size], y_train[rank::size], x_test, y_test


def batches(x, y, batch_size, epoch, seed=42, drop_last=False):
    """This epoch's shuffled mini-batches of (x, y); drop_last leaves out a short
    last batch."""
    order = np.random.default_rng(seed + epoch).permutation(len(x))
    end = len(x) - len(x) % batch_size if drop_last else len(x)
    for start in range(0, end, batch_size):
        rows = order[start:start + batch_size]
        yield x[rows], y[rows]
