"""Data-parallel classification of scikit-learn's digits with TensorFlow 2 and
Perseus' Horovod API: a GradientTape training loop inside tf.function.

    .venv-tf/bin/python examples/tensorflow/tf2_digits.py                      # one process
    .venv/bin/mpirun -np 2 .venv-tf/bin/python examples/tensorflow/tf2_digits.py

Each rank trains on its own shard of the training set; hvd.DistributedGradientTape
averages the gradients, so the global batch is batch_size x size and the learning
rate is scaled by size. Rank 0's initial weights are broadcast after the first step
(the optimizer's variables exist only then). Test accuracy is computed over the
whole test set: each rank scores a slice, and the counts are summed by allreduce.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import perseus.tensorflow.horovod as hvd  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by size")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def main():
    args = parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.random.set_seed(args.seed + rank)  # ranks start different; the broadcast fixes it

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2,
                                                        random_state=args.seed, stratify=y)
    shard = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shard(size, rank)
    train = shard.shuffle(len(x_train), seed=args.seed).batch(args.batch_size)

    model = tf.keras.Sequential([tf.keras.Input((64,)),
                                 tf.keras.layers.Dense(128, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = tf.keras.optimizers.SGD(learning_rate=args.lr * size, momentum=0.9)

    @tf.function
    def step(images, labels, first):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:  # a Python bool: traced once with the broadcast, once without
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    def accuracy():
        part = np.array_split(np.arange(len(x_test)), size)[rank]
        logits = model(x_test[part], training=False)
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y_test[part], tf.int64))
        return float(hvd.allreduce(correct, op=hvd.Sum)) / len(x_test)

    first = True
    for epoch in range(1, args.epochs + 1):
        losses = []
        for images, labels in train:
            losses.append(float(step(images, labels, first)))
            first = False
        loss = float(hvd.allreduce(tf.constant(np.mean(losses)), name="epoch_loss"))
        acc = accuracy()
        if rank == 0:
            print("Epoch %2d/%d: loss %.4f, test accuracy %.2f%%"
                  % (epoch, args.epochs, loss, 100 * acc), flush=True)
    if rank == 0:
        print("Final test accuracy: %.2f%% on %d rank(s)" % (100 * acc, size), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
