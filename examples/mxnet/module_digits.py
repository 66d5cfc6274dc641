"""Data-parallel digits with MXNet's Module API and Perseus' KVStore:
Module.fit(..., kvstore=perseus.mxnet.create('dist_sync_perseus')).

    .venv/bin/mpirun -np 2 .venv-mx/bin/python examples/mxnet/module_digits.py

Each rank fits on its own shard; the store sums the gradients and applies the
optimizer to the sum on every rank alike. Module scales the gradient by
1 / (batch_size x num_workers) itself for a dist_sync store. Rank 0 scores the
whole test set.
"""

import argparse
import logging

import mxnet as mx

import perseus.mxnet
from digits_data import load


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def mlp():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=128, name="fc1")
    hidden = mx.sym.Activation(hidden, act_type="relu")
    logits = mx.sym.FullyConnected(hidden, num_hidden=10, name="fc2")
    return mx.sym.SoftmaxOutput(logits, name="softmax")


def main():
    args = parse_args()
    kv = perseus.mxnet.create("dist_sync_perseus")
    rank, size = kv.rank, kv.num_workers
    x_train, y_train, x_test, y_test = load(rank, size, args.seed)
    mx.random.seed(args.seed)
    train = mx.io.NDArrayIter(x_train, y_train, batch_size=args.batch_size, shuffle=True,
                              label_name="softmax_label")
    test = mx.io.NDArrayIter(x_test, y_test, batch_size=args.batch_size,
                             label_name="softmax_label")

    module = mx.mod.Module(mlp(), context=mx.cpu())
    epochs_seen = []

    def report(epoch, symbol, arg_params, aux_params):
        acc = dict(module.score(test, "acc"))["accuracy"]
        epochs_seen.append(acc)
        if rank == 0:
            print("Epoch %2d/%d: test accuracy %.2f%%" % (epoch + 1, args.epochs, 100 * acc),
                  flush=True)

    logging.getLogger().setLevel(logging.WARNING)
    module.fit(train, num_epoch=args.epochs, kvstore=kv, optimizer="sgd",
               optimizer_params={"learning_rate": args.lr, "momentum": 0.9},
               initializer=mx.init.Xavier(), epoch_end_callback=report)
    if rank == 0:
        print("Final test accuracy: %.2f%% on %d rank(s)" % (100 * epochs_seen[-1], size),
              flush=True)


if __name__ == "__main__":
    main()
