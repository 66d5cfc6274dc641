"""SyncBatchNorm: batch normalization over the global batch of a data-parallel job.

Semantics follow torch.nn.SyncBatchNorm (and Horovod's hvd.SyncBatchNorm): in
training, the mean and variance of each channel are those of the concatenation of
every rank's batch (ranks may hold different batch sizes, even empty ones), the
running statistics move identically on every rank (with the unbiased global
variance, as torch does), and backward gives every rank the gradient of the sum of
all ranks' losses with respect to its own input. Weight and bias gradients are this
rank's share, as in torch: the optimizer's allreduce combines them. In eval mode (or
whenever no synchronization is needed, e.g. a world of one) it is plain
F.batch_norm and communicates nothing.

Communication per training step: one allgather in forward (each rank's count, mean
and sum of squared deviations per channel, combined on every rank in float64 with
Chan's parallel formula, so no sum-of-squares cancellation) and one Sum-allreduce in
backward (the two per-channel gradient sums, fused). Collectives are unnamed, so
every rank must run the layers in the same order, as with Horovod.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from perseus.common.process_sets import global_process_set
from perseus.torch import mpi_ops as _m

__all__ = ["SyncBatchNorm"]

_WORK = torch.float64  # statistics are combined in double precision


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


def _per_channel(v, x):
    """A (C,) vector shaped to broadcast against x (N, C, ...), in x's dtype."""
    return v.to(x.dtype).reshape([1, -1] + [1] * (x.dim() - 2))


def _local_stats(x):
    """(count, mean (C,), M2 (C,)) of this rank's input, in float64; M2 is the sum
    of squared deviations from the local mean."""
    channels = x.shape[1]
    count = x.numel() // channels if channels else 0
    if count == 0:
        zeros = torch.zeros(channels, dtype=_WORK, device=x.device)
        return 0, zeros, zeros.clone()
    xs = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    var, mean = torch.var_mean(xs, dim=_reduce_dims(x), correction=0)
    mean = mean.to(_WORK)
    return count, mean, var.to(_WORK) * count


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        x = x.detach().contiguous()
        channels = x.shape[1]
        count, mean, m2 = _local_stats(x)

        # One collective: every rank's [count, mean, M2] (1 + 2C doubles each), on
        # x's device (new_full: no host-to-device copy).
        mine = torch.cat([mean.new_full((1,), float(count)), mean, m2]).unsqueeze(0)
        gathered = _m.allgather(mine, process_set=process_set)
        counts = gathered[:, 0]
        means = gathered[:, 1:1 + channels]
        m2s = gathered[:, 1 + channels:]
        total = counts.sum()
        if count > 1 and not x.is_cpu:
            n = total  # > 1 already: no host synchronisation on the GPU's hot path
        else:
            n = float(total.item())
            if n <= 1:
                raise ValueError("Expected more than 1 value per channel when training, got %d "
                                 "over all ranks (input size on this rank %s)"
                                 % (int(n), list(x.shape)))
        w = (counts / total).unsqueeze(1)
        global_mean = (w * means).sum(0)
        global_m2 = m2s.sum(0) + (counts.unsqueeze(1) * (means - global_mean) ** 2).sum(0)
        biased_var = global_m2 / n
        invstd = torch.rsqrt(biased_var + eps)

        if running_mean is not None:
            unbiased_var = global_m2 / (n - 1)
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased_var.to(running_var.dtype), alpha=momentum)

        scale = invstd if weight is None else invstd * weight.detach().to(_WORK)
        y = (x - _per_channel(global_mean, x)) * _per_channel(scale, x)
        if bias is not None:
            y = y + _per_channel(bias.detach(), x)

        ctx.save_for_backward(x, weight)
        ctx.mean = global_mean
        ctx.invstd = invstd
        ctx.total = n
        ctx.process_set = process_set
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_out = grad_out.detach().contiguous()
        need_x, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_x = grad_w = grad_b = None
        if not (need_x or need_w or need_b):
            return (None,) * 8

        dims = _reduce_dims(x)
        xhat = (x - _per_channel(ctx.mean, x)) * _per_channel(ctx.invstd, x)
        if x.numel():
            sum_dy = grad_out.sum(dims).to(_WORK)
            sum_dy_xhat = (grad_out * xhat).sum(dims).to(_WORK)
        else:
            sum_dy = torch.zeros(x.shape[1], dtype=_WORK, device=x.device)
            sum_dy_xhat = torch.zeros(x.shape[1], dtype=_WORK, device=x.device)
        if need_w:
            grad_w = sum_dy_xhat.to(weight.dtype)
        if need_b:
            grad_b = sum_dy.to(weight.dtype if weight is not None else x.dtype)

        if need_x:
            # One collective: the two per-channel sums over the global batch.
            channels = x.shape[1]
            summed = _m.allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=_m.Sum,
                                  process_set=ctx.process_set)
            mean_dy = summed[:channels] / ctx.total
            mean_dy_xhat = summed[channels:] / ctx.total
            scale = ctx.invstd if weight is None else ctx.invstd * weight.detach().to(_WORK)
            grad_x = ((grad_out - _per_channel(mean_dy, x) - xhat * _per_channel(mean_dy_xhat, x))
                      * _per_channel(scale, x))
        return grad_x, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training statistics span every rank of `process_set`.

    Drop-in for torch.nn.BatchNorm1d/2d/3d (inputs (N, C), (N, C, L), (N, C, H, W),
    (N, C, D, H, W)) with torch.nn.SyncBatchNorm's semantics, on Perseus collectives.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set,
                 device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def _check_non_zero_input_channels(self, input):
        if input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")

    def forward(self, input):
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)

        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked.item())

        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        use_buffers = not self.training or self.track_running_stats
        running_mean = self.running_mean if use_buffers else None
        running_var = self.running_var if use_buffers else None

        # Running statistics need no communication, nor does a set of one rank. Batch
        # statistics are the whole batch's, in eval mode too (track_running_stats=False),
        # as in Horovod; torch's SyncBatchNorm uses each rank's own batch there.
        if not bn_training or self.process_set.size() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                bn_training, factor, self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                            running_var, self.eps, factor, self.process_set)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_set=global_process_set):
        """A copy of `module` in which every BatchNorm*d layer (any _BatchNorm) is a
        SyncBatchNorm on `process_set`, carrying over parameters, buffers,
        requires_grad and train/eval mode. Like torch's, it converts in place
        below the top and returns the (possibly new) top module."""
        converted = module
        if isinstance(module, _BatchNorm):
            ref = module.weight if module.affine else module.running_mean
            factory = {} if ref is None else {"device": ref.device, "dtype": ref.dtype}
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_set=process_set, **factory)
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.training = module.training
            if hasattr(module, "qconfig"):
                converted.qconfig = module.qconfig
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return converted
