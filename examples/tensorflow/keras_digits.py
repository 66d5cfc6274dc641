"""Data-parallel Keras model.fit on scikit-learn's digits with Perseus' Horovod
Keras API: DistributedOptimizer + BroadcastGlobalVariablesCallback +
MetricAverageCallback + LearningRateWarmupCallback.

    .venv/bin/mpirun -np 2 .venv-tf/bin/python examples/tensorflow/keras_digits.py
    TF_USE_LEGACY_KERAS=1 .venv/bin/mpirun -np 2 .venv-tf/bin/python examples/tensorflow/keras_digits.py

The second line runs the same script on Keras 2 (tf-keras). Each rank fits its own
shard; rank 0 prints and evaluates.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import perseus.tensorflow.keras as hvd  # noqa: E402

keras = tf.keras  # Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by size")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.random.set_seed(args.seed + rank)  # ranks start different; the callback fixes it

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2,
                                                        random_state=args.seed, stratify=y)
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=args.lr * size,
                                                        momentum=0.9))
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr * size,
                                                          warmup_epochs=2)]
    model.fit(x_shard, y_shard, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=2 if rank == 0 else 0)
    if rank == 0:
        _, acc = model.evaluate(x_test, y_test, verbose=0)
        print("Final test accuracy: %.2f%% on %d rank(s)" % (100 * acc, size), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
