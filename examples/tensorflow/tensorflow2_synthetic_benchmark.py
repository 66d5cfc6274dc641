"""Synthetic training throughput of TensorFlow 2 on Perseus, in Horovod's output
format (tensorflow2_synthetic_benchmark.py): random images, a fixed model, one
DistributedGradientTape step per batch inside tf.function.

    .venv/bin/mpirun -np 2 .venv-tf/bin/python examples/tensorflow/tensorflow2_synthetic_benchmark.py \\
        --model cnn --num-threads 1

Models: resnet50 (Keras' ResNet50, 224x224), cnn (a small conv net, 32x32) and mlp
(784 -> 512 -> 512 -> 10), the latter two sized for CPU runs. The default is resnet50
where TensorFlow sees a GPU, else cnn (resnet50 on a CPU printed nothing for minutes).
As Horovod's, the output counts devices: GPUs, or on a CPU run, ranks as "CPUs".
Scaling efficiency = total img/sec at np=N / (N x img/sec at np=1).
"""

import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import perseus.tensorflow.horovod as hvd  # noqa: E402


def build(name):
    keras = tf.keras
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None), (224, 224, 3), 1000
    if name == "cnn":
        model = keras.Sequential([keras.Input((32, 32, 3)),
                                  keras.layers.Conv2D(32, 3, activation="relu"),
                                  keras.layers.MaxPooling2D(),
                                  keras.layers.Conv2D(64, 3, activation="relu"),
                                  keras.layers.GlobalAveragePooling2D(),
                                  keras.layers.Dense(10)])
        return model, (32, 32, 3), 10
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
    return model, (784,), 10


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression on the wire")
    p.add_argument("--model", choices=["resnet50", "cnn", "mlp"],
                   help="default: resnet50 with a GPU, cnn on a CPU")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=10)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--num-threads", type=int, default=0,
                   help="TensorFlow intra/inter-op threads per rank (0: TensorFlow's default)")
    args = p.parse_args()

    if args.num_threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(args.num_threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.num_threads)
    hvd.init()
    gpu = bool(tf.config.list_physical_devices("GPU"))
    device = "GPU" if gpu else "CPU"  # Horovod's wording: ranks are "CPUs" on a CPU run
    args.model = args.model or ("resnet50" if gpu else "cnn")

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    log("Model: %s" % args.model)
    log("Batch size: %d" % args.batch_size)
    log("Number of %ss: %d" % (device, hvd.size()))
    tf.random.set_seed(42)
    model, shape, classes = build(args.model)
    opt = tf.keras.optimizers.SGD(0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    data = tf.random.uniform((args.batch_size,) + shape)
    target = tf.random.uniform((args.batch_size,), maxval=classes, dtype=tf.int64)

    @tf.function
    def step(first):
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:  # every rank continues from rank 0's weights
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    log("Tracing the step and broadcasting rank 0's weights...")
    step(True)
    log("Running warmup...")
    timeit.timeit(lambda: step(False), number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(lambda: step(False), number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, device))
        img_secs.append(img_sec)
    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    log("Img/sec per %s: %.1f +-%.1f" % (device, mean, conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f" % (hvd.size(), device, hvd.size() * mean,
                                                    hvd.size() * conf))
    hvd.shutdown()


if __name__ == "__main__":
    main()
