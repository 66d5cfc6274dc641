"""Synthetic data-parallel training benchmark, in the format of Horovod's
pytorch_synthetic_benchmark.py: random images, a fixed model, and the throughput of
forward + backward + DistributedOptimizer step.

    mpirun -np 2 python examples/pytorch/pytorch_synthetic_benchmark.py --model mlp --no-cuda
    perseusrun -np 2 python examples/pytorch/pytorch_synthetic_benchmark.py --model resnet50

Prints per iteration 'Iter #i: x img/sec per GPU', then 'Img/sec per GPU: m +-c'
and 'Total img/sec on N GPU(s): M +-C' (c is 1.96 standard deviations over the
iterations, as in Horovod); on a CPU run, as Horovod's, "CPU" for "GPU", each rank
counting as one. The default model is resnet50 on GPUs, resnet_small on a CPU.
"""

import argparse
import os
import sys
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

import perseus.torch.horovod as hvd  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch synthetic benchmark on Perseus",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fp16-allreduce", action="store_true", default=False,
                   help="use fp16 compression during allreduce")
    p.add_argument("--model", choices=sorted(models.MODELS),
                   help="model to benchmark (default: resnet50 with CUDA, else resnet_small; "
                        "resnet_small and mlp are sized for CPUs)")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    p.add_argument("--num-warmup-batches", type=int, default=10,
                   help="number of warm-up batches that don't count towards benchmark")
    p.add_argument("--num-batches-per-iter", type=int, default=10,
                   help="number of batches per benchmark iteration")
    p.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    p.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
    p.add_argument("--use-adasum", action="store_true", default=False, help="use adasum algorithm to do reduction")
    p.add_argument("--num-threads", type=int, default=0,
                   help="torch intra-op threads per rank (0: torch's default, which follows OMP_NUM_THREADS)")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    # resnet50 on a CPU took minutes before its first line of results
    args.model = args.model or ("resnet50" if args.cuda else "resnet_small")
    return args


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.backends.cudnn.benchmark = True

    build, input_shape, num_classes = models.MODELS[args.model]
    model = build()
    lr_scaler = 1
    if args.cuda:
        model.cuda()
        # With Adasum on GPUs the reduction happens within a node first, so scale by local size.
        lr_scaler = hvd.local_size() if args.use_adasum and hvd.nccl_built() else 1
    if not args.use_adasum:
        lr_scaler = hvd.size()

    optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)

    # Every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, *input_shape)
    target = torch.randint(0, num_classes, (args.batch_size,))
    if args.cuda:
        data, target = data.cuda(), target.cuda()

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if args.cuda:
            torch.cuda.synchronize()

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    device = "GPU" if args.cuda else "CPU"  # as Horovod's: on a CPU run each rank is a "CPU"
    log("Model: %s" % args.model)
    log("Batch size: %d" % args.batch_size)
    log("Number of %ss: %d" % (device, hvd.size()))

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, device))
        img_secs.append(img_sec)

    img_sec_mean = float(np.mean(img_secs))
    img_sec_conf = float(1.96 * np.std(img_secs))
    log("Img/sec per %s: %.1f +-%.1f" % (device, img_sec_mean, img_sec_conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f"
        % (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))
    hvd.shutdown()


if __name__ == "__main__":
    main()
