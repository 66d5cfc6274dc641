"""TF1-style data-parallel training (graph + tf.compat.v1.train.MonitoredTrainingSession)
on scikit-learn's digits, following the Horovod steps of the AIACC-Training docs:

  1. hvd.init();
  2. scale the learning rate by hvd.size();
  3. wrap the optimizer in hvd.DistributedOptimizer;
  4. add hvd.BroadcastGlobalVariablesHook(0) so every rank starts from rank 0's
     variables;
  5. divide the number of steps by hvd.size();
  6. write checkpoints on rank 0 only (checkpoint_dir=None elsewhere).

MonitoredTrainingSession restores from the newest checkpoint in --checkpoint-dir (default
~/.cache/perseus/checkpoints/tf1_digits), so rank 0 first checks that the folder is the
user's own and writable by no one else (perseus.common.private_files); else every rank
stops, saying why.

    .venv/bin/mpirun -np 2 .venv-tf/bin/python examples/tensorflow/tf1_digits.py
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import perseus.tensorflow.horovod as hvd  # noqa: E402
from perseus.common import private_files  # noqa: E402

v1 = tf.compat.v1


class _EvalHook(v1.train.SessionRunHook):
    """Scores this rank's slice of the test set when training ends."""

    def __init__(self, fetch, feed):
        self.fetch, self.feed, self.result = fetch, feed, None

    def end(self, session):
        self.result = session.run(self.fetch, self.feed)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1200, help="total, over all ranks")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by size")
    p.add_argument("--checkpoint-dir", default=private_files.default_checkpoint("tf1_digits"))
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()

    hvd.init()                                                          # 1
    rank, size = hvd.rank(), hvd.size()
    problem = None
    if rank == 0:
        try:
            private_files.private_folder(args.checkpoint_dir)
        except OSError as e:
            problem = str(e)
    problem = hvd.broadcast_object(problem, root_rank=0, name="checkpoint.problem")
    if problem:
        raise SystemExit("tf1_digits: --checkpoint-dir: %s" % problem)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2,
                                                        random_state=args.seed, stratify=y)
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]

    with tf.Graph().as_default():
        v1.set_random_seed(args.seed + rank)  # ranks start different; the hook fixes it
        images = v1.placeholder(tf.float32, [None, 64])
        labels = v1.placeholder(tf.int64, [None])
        init = v1.glorot_uniform_initializer()
        w1 = v1.get_variable("w1", [64, 128], initializer=init)
        b1 = v1.get_variable("b1", [128], initializer=v1.zeros_initializer())
        w2 = v1.get_variable("w2", [128, 10], initializer=init)
        b2 = v1.get_variable("b2", [10], initializer=v1.zeros_initializer())
        logits = tf.matmul(tf.nn.relu(tf.matmul(images, w1) + b1), w2) + b2
        loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.int64))

        opt = v1.train.MomentumOptimizer(args.lr * size, momentum=0.9)  # 2
        opt = hvd.DistributedOptimizer(opt)                               # 3
        global_step = v1.train.get_or_create_global_step()
        train_op = opt.minimize(loss, global_step=global_step)

        part = np.array_split(np.arange(len(x_test)), size)[rank]
        evaluation = _EvalHook(correct, {images: x_test[part], labels: y_test[part]})
        hooks = [hvd.BroadcastGlobalVariablesHook(0),                    # 4
                 v1.train.StopAtStepHook(last_step=args.steps // size),  # 5
                 evaluation]
        checkpoint_dir = args.checkpoint_dir if rank == 0 else None       # 6
        rng = np.random.default_rng(args.seed + rank)
        with v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks,
                                               save_checkpoint_steps=200,
                                               save_checkpoint_secs=None) as sess:
            while not sess.should_stop():
                batch = rng.choice(len(x_shard), args.batch_size, replace=False)
                step, value, _ = sess.run([global_step, loss, train_op],
                                          {images: x_shard[batch], labels: y_shard[batch]})
                if rank == 0 and step % 100 == 0:
                    print("step %4d: loss %.4f" % (step, value), flush=True)
    total = int(hvd.allreduce(tf.constant(evaluation.result, tf.int64), op=hvd.Sum))
    if rank == 0:
        print("Final test accuracy: %.2f%% on %d rank(s)" % (100.0 * total / len(x_test), size),
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
