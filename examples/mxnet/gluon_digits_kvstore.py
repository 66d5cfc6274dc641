"""Data-parallel digits with an unchanged Gluon script whose KVStore is swapped for
Perseus' (the AIACC-Training way), one process per device under mpirun:

    -kv = mx.kvstore.create(args.kv_store)
    +kv = perseus.mxnet.create('dist_sync_perseus')

    .venv/bin/mpirun -np 2 .venv-mx/bin/python examples/mxnet/gluon_digits_kvstore.py

The store sums the gradients of every rank and applies the optimizer to the sum on
every rank alike (update_on_kvstore), so, as with MXNet's dist_sync, step() takes
the global batch size. Every rank starts from the same seed; the store also
initializes itself with rank 0's weights. Rank 0 scores the whole test set.
"""

import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import perseus.mxnet
from digits_data import batches, load


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--kv-store", default="dist_sync_perseus")
    return p.parse_args()


def main():
    args = parse_args()
    kv = perseus.mxnet.create(args.kv_store)
    rank, size = kv.rank, kv.num_workers
    x_train, y_train, x_test, y_test = load(rank, size, args.seed)
    mx.random.seed(args.seed)

    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(128, activation="relu", in_units=64), gluon.nn.Dense(10, in_units=128))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": args.lr, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    for epoch in range(1, args.epochs + 1):
        losses = []
        # Whole batches only: with the optimizer on a distributed store, gluon fixes
        # the gradient scale at the first step and refuses another batch size.
        for images, labels in batches(x_train, y_train, args.batch_size, epoch, args.seed,
                                      drop_last=True):
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(images)), mx.nd.array(labels))
            loss.backward()
            trainer.step(args.batch_size * size)  # dist_sync: the global batch
            losses.append(loss.mean().asscalar())
        predicted = net(mx.nd.array(x_test)).argmax(axis=1).asnumpy()
        acc = float(np.mean(predicted == y_test))
        if rank == 0:
            print("Epoch %2d/%d: loss %.4f, test accuracy %.2f%%"
                  % (epoch, args.epochs, float(np.mean(losses)), 100 * acc), flush=True)
    if rank == 0:
        print("Final test accuracy: %.2f%% on %d rank(s)" % (100 * acc, size), flush=True)


if __name__ == "__main__":
    main()
