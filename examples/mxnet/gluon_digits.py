"""Data-parallel classification of scikit-learn's digits with MXNet Gluon and
Perseus' Horovod API.

    .venv-mx/bin/python examples/mxnet/gluon_digits.py                      # one process
    .venv/bin/mpirun -np 2 .venv-mx/bin/python examples/mxnet/gluon_digits.py

Each rank trains on its own shard; hvd.DistributedTrainer averages the gradients
(allreduce inside MXNet's engine), so the global batch is batch_size x size and the
learning rate is scaled by size. Ranks start from different random weights until
hvd.broadcast_parameters gives them rank 0's. Test accuracy covers the whole test
set: each rank scores a slice and the counts are summed by allreduce.
"""

import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import perseus.mxnet as hvd
from digits_data import batches, load


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
    x_train, y_train, x_test, y_test = load(rank, size, args.seed)
    mx.random.seed(args.seed + rank)  # ranks start different; the broadcast fixes it

    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(128, activation="relu", in_units=64), gluon.nn.Dense(10, in_units=128))
    net.initialize(mx.init.Xavier())
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd",
                                     {"learning_rate": args.lr * size, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def accuracy():
        part = np.array_split(np.arange(len(x_test)), size)[rank]
        predicted = net(mx.nd.array(x_test[part])).argmax(axis=1)
        correct = (predicted == mx.nd.array(y_test[part])).sum().astype("int64")
        return hvd.allreduce(correct, op=hvd.Sum, name="correct").asscalar() / len(x_test)

    for epoch in range(1, args.epochs + 1):
        total, count = mx.nd.zeros(1), 0
        for images, labels in batches(x_train, y_train, args.batch_size, epoch, args.seed):
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(images)), mx.nd.array(labels))
            loss.backward()
            trainer.step(len(images))
            total += loss.mean()
            count += 1
        mean_loss = hvd.allreduce(total / count, name="epoch_loss").asscalar()
        acc = accuracy()
        if rank == 0:
            print("Epoch %2d/%d: loss %.4f, test accuracy %.2f%%"
                  % (epoch, args.epochs, mean_loss, 100 * acc), flush=True)
    if rank == 0:
        print("Final test accuracy: %.2f%% on %d rank(s)" % (100 * acc, size), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
