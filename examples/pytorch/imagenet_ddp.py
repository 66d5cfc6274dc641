"""ImageNet-style training written against torch.distributed and torch's
DistributedDataParallel, run on Perseus by changing two imports (marked "Perseus").

    mpirun -np 2 python examples/pytorch/imagenet_ddp.py --synthetic-data \\
        --dist-url tcp://127.0.0.1:88 --world-size 1 --rank 0
    JOB=imagenet_ddp mpirun -np 2 ./train.sh          # through train.sh, ranks from MPI

Under mpirun Perseus takes rank and world size from MPI: the script's own
--dist-url / --world-size / --rank are accepted (with one warning when they
contradict MPI), so a command line written for one process still works. Without
the Perseus imports (torch.distributed, torch's DDP) the script is an ordinary
torch DDP script: launch it with torchrun, or pass --world-size/--rank/--dist-url.

Models come from models.py (torchvision does not install beside this CPU torch):
-a resnet50 / resnet18 take 3x224x224 images; the default, resnet_small, 3x32x32.
--synthetic-data trains on random images; real ImageNet folders need torchvision.
Batch size is per process. Defaults are small so that a CPU finishes in seconds.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.utils.data
import torch.utils.data.distributed

import perseus                                  # Perseus: added
import perseus.torch.distributed as dist        # Perseus: was `import torch.distributed as dist`

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="ImageNet-style training with DDP")
    p.add_argument("data", nargs="?", default="imagenet", help="path to the dataset")
    p.add_argument("-a", "--arch", default="resnet_small", choices=sorted(models.MODELS),
                   help="model architecture (default: resnet_small)")
    p.add_argument("-j", "--workers", default=0, type=int, help="data loading workers")
    p.add_argument("--epochs", default=2, type=int, help="number of total epochs to run")
    p.add_argument("--start-epoch", default=0, type=int, help="manual epoch number (for restarts)")
    p.add_argument("-b", "--batch-size", default=32, type=int, help="mini-batch size per process")
    p.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr",
                   help="initial learning rate")
    p.add_argument("--momentum", default=0.9, type=float)
    p.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    p.add_argument("-p", "--print-freq", default=2, type=int, help="print frequency (batches)")
    p.add_argument("--resume", default="", type=str, help="path to a checkpoint to resume from")
    p.add_argument("--checkpoint", default="", type=str,
                   help="where rank 0 saves a checkpoint after each epoch (empty: nowhere)")
    p.add_argument("-e", "--evaluate", action="store_true", help="evaluate on validation set")
    p.add_argument("--world-size", default=-1, type=int, help="number of nodes")
    p.add_argument("--rank", default=-1, type=int, help="node rank")
    p.add_argument("--dist-url", default="env://", type=str, help="url to set up training")
    p.add_argument("--dist-backend", default="gloo", type=str, help="distributed backend")
    p.add_argument("--seed", default=None, type=int, help="seed for initializing training")
    p.add_argument("--gpu", default=None, type=int, help="GPU id to use")
    p.add_argument("--synthetic-data", "--dummy", action="store_true", dest="synthetic",
                   help="train on random images instead of a dataset")
    p.add_argument("--train-samples", default=256, type=int, help="synthetic training images")
    p.add_argument("--val-samples", default=64, type=int, help="synthetic validation images")
    p.add_argument("--threads", default=0, type=int, help="torch threads (0: torch's default)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.dist_url == "env://" and args.world_size == -1 and "WORLD_SIZE" in os.environ:
        args.world_size = int(os.environ["WORLD_SIZE"])
    args.distributed = args.world_size > 1
    if getattr(dist, "use_perseus", False):     # Perseus: mpirun made every process a rank
        args.distributed = True
        if torch.cuda.is_available():
            args.gpu = dist.get_local_rank()
    main_worker(args)


def main_worker(args):
    if args.distributed:
        if args.dist_url == "env://" and args.rank == -1 and "RANK" in os.environ:
            args.rank = int(os.environ["RANK"])
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1

    build, input_shape, num_classes = models.MODELS[args.arch]
    model = build()
    if rank == 0:
        print("=> creating model '%s' on %d process(es)" % (args.arch, world), flush=True)

    device = torch.device("cpu")
    if not torch.cuda.is_available():
        if rank == 0:
            print("using CPU, this will be slow", flush=True)
        if args.distributed:
            model = perseus.torch.nn.parallel.DistributedDataParallel(model)   # Perseus
    elif args.distributed:
        if args.gpu is not None:
            torch.cuda.set_device(args.gpu)
            model.cuda(args.gpu)
            model = perseus.torch.nn.parallel.DistributedDataParallel(         # Perseus
                model, device_ids=[args.gpu])
            device = torch.device("cuda", args.gpu)
        else:
            model.cuda()
            model = perseus.torch.nn.parallel.DistributedDataParallel(model)   # Perseus
            device = torch.device("cuda")
    else:
        device = torch.device("cuda", args.gpu or 0)
        model = model.to(device)

    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    best_acc1 = 0.0
    if args.resume:
        checkpoint = torch.load(args.resume, map_location=device, weights_only=False)
        args.start_epoch = checkpoint["epoch"]
        best_acc1 = checkpoint["best_acc1"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        if rank == 0:
            print("=> loaded checkpoint '%s' (epoch %d)" % (args.resume, args.start_epoch))

    train_set, val_set = datasets(args, input_shape, num_classes)
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(
            train_set, num_replicas=dist.get_world_size(), rank=dist.get_rank())
        val_sampler = torch.utils.data.distributed.DistributedSampler(
            val_set, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=False,
            drop_last=True)
    else:
        train_sampler = val_sampler = None
    train_loader = torch.utils.data.DataLoader(
        train_set, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, sampler=train_sampler)
    val_loader = torch.utils.data.DataLoader(
        val_set, batch_size=args.batch_size, shuffle=False, num_workers=args.workers,
        sampler=val_sampler)

    if args.evaluate:
        validate(val_loader, model, criterion, device, args, rank)
        return

    for epoch in range(args.start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, device, args, rank)
        acc1 = validate(val_loader, model, criterion, device, args, rank)
        scheduler.step()
        best_acc1 = max(acc1, best_acc1)
        if rank == 0 and args.checkpoint:
            torch.save({"epoch": epoch + 1, "arch": args.arch, "state_dict": model.state_dict(),
                        "best_acc1": best_acc1, "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, args.checkpoint)
    if args.distributed:
        dist.destroy_process_group()


def datasets(args, input_shape, num_classes):
    if not args.synthetic:
        try:
            import torchvision.datasets as vdatasets
            import torchvision.transforms as transforms
        except ImportError:
            raise SystemExit("reading %r needs torchvision; pass --synthetic-data to train on "
                             "random images" % args.data)
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        size = input_shape[-1]
        train_set = vdatasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
            transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
            transforms.ToTensor(), normalize]))
        val_set = vdatasets.ImageFolder(os.path.join(args.data, "val"), transforms.Compose([
            transforms.Resize(int(size * 8 / 7)), transforms.CenterCrop(size),
            transforms.ToTensor(), normalize]))
        return train_set, val_set
    # The same random images on every rank (fixed seed); the sampler splits them.
    g = torch.Generator().manual_seed(0)

    def fake(n):
        return torch.utils.data.TensorDataset(torch.randn((n,) + tuple(input_shape), generator=g),
                                              torch.randint(0, num_classes, (n,), generator=g))

    return fake(args.train_samples), fake(args.val_samples)


class AverageMeter:
    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.val = self.sum = self.count = self.avg = 0.0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def all_reduce(self):
        total = torch.tensor([self.sum, self.count], dtype=torch.float32)
        dist.all_reduce(total, dist.ReduceOp.SUM, async_op=False)
        self.sum, self.count = total.tolist()
        self.avg = self.sum / max(self.count, 1)

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)


def accuracy(output, target, topk=(1,)):
    with torch.no_grad():
        maxk = min(max(topk), output.shape[1])
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:min(k, maxk)].reshape(-1).float().sum(0) * 100.0 / target.size(0)
                for k in topk]


def train(loader, model, criterion, optimizer, epoch, device, args, rank):
    batch_time, losses = AverageMeter("Time", ":6.3f"), AverageMeter("Loss", ":.4e")
    top1, top5 = AverageMeter("Acc@1", ":6.2f"), AverageMeter("Acc@5", ":6.2f")
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(loader):
        images, target = images.to(device), target.to(device)
        output = model(images)
        loss = criterion(output, target)
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1.item(), images.size(0))
        top5.update(acc5.item(), images.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time.update(time.time() - end)
        end = time.time()
        if rank == 0 and (i % args.print_freq == 0 or i == len(loader) - 1):
            print("Epoch: [%d][%3d/%3d]\t%s\t%s\t%s\t%s" % (epoch, i + 1, len(loader), batch_time,
                                                          losses, top1, top5), flush=True)


def validate(loader, model, criterion, device, args, rank):
    losses = AverageMeter("Loss", ":.4e")
    top1, top5 = AverageMeter("Acc@1", ":6.2f"), AverageMeter("Acc@5", ":6.2f")
    model.eval()
    with torch.no_grad():
        for images, target in loader:
            images, target = images.to(device), target.to(device)
            output = model(images)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            losses.update(criterion(output, target).item(), images.size(0))
            top1.update(acc1.item(), images.size(0))
            top5.update(acc5.item(), images.size(0))
    if args.distributed:
        for meter in (losses, top1, top5):
            meter.all_reduce()
    if rank == 0:
        print(" * Acc@1 {top1.avg:.3f} Acc@5 {top5.avg:.3f} Loss {loss.avg:.4f}".format(
            top1=top1, top5=top5, loss=losses), flush=True)
    return top1.avg


if __name__ == "__main__":
    main()
