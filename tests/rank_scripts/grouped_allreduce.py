"""grouped_allreduce, grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_:
every op x dtype on a group of tensors of different shapes, prescale/postscale, many
groups in flight at once, and a large group."""
import time

import torch

from common import (DTYPES, FLOAT_DTYPES, assert_reduced, assert_unchanged, dtype_name, hvd, init,
                    kind_for, main, make_tensor, op_name)

GROUP_SHAPES = [(), (0,), (7,), (3, 4), (2, 0, 2), (1, 1, 5)]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def group_inputs(name, op, dtype, size, shapes=GROUP_SHAPES):
    """inputs[i][r]: tensor i of the group as rank r submits it."""
    return [[make_tensor("%s.%d" % (name, i), r, shape, dtype, kind_for(op)) for r in range(size)]
            for i, shape in enumerate(shapes)]


def check_group(outs, inputs, op, dtype, what, **scale):
    outs = list(outs)
    assert len(outs) == len(inputs), "%s: %d results for %d tensors" % (what, len(outs), len(inputs))
    for i, (out, xs) in enumerate(zip(outs, inputs)):
        assert_reduced(out, xs, op, dtype, "%s[%d]" % (what, i), **scale)


def body():
    rank, size = init()

    for op in OPS:
        for dtype in DTYPES:
            tag = "%s.%s" % (op_name(op), dtype_name(dtype))

            name = "gar.blocking." + tag
            inputs = group_inputs(name, op, dtype, size)
            mine = [xs[rank].clone() for xs in inputs]
            outs = hvd.grouped_allreduce(mine, name=name, op=op)
            for t, xs in zip(mine, inputs):
                assert_unchanged(t, xs[rank], name)
            check_group(outs, inputs, op, dtype, name)

            name = "gar.inplace." + tag
            inputs = group_inputs(name, op, dtype, size)
            mine = [xs[rank].clone() for xs in inputs]
            outs = hvd.grouped_allreduce_(mine, name=name, op=op)
            assert type(outs) is tuple and all(o is t for o, t in zip(outs, mine)), name
            check_group(mine, inputs, op, dtype, name + " (input tensors)")
            check_group(outs, inputs, op, dtype, name + " (returned tensors)")

    # Many groups in flight at once, out of place and in place, awaited in mixed order.
    pending = []
    for op in OPS:
        for dtype in DTYPES:
            for inplace in (False, True):
                name = "gar.async%s.%s.%s" % ("_" if inplace else "", op_name(op), dtype_name(dtype))
                inputs = group_inputs(name, op, dtype, size)
                mine = [xs[rank].clone() for xs in inputs]
                submit = hvd.grouped_allreduce_async_ if inplace else hvd.grouped_allreduce_async
                pending.append((submit(mine, name=name, op=op), mine, inputs, op, dtype, name, inplace))
    order = pending[1::2] + pending[0::2]
    for handle, mine, inputs, op, dtype, name, inplace in order:
        while not hvd.poll(handle):
            time.sleep(0.0005)
        outs = hvd.synchronize(handle)
        assert type(outs) is tuple, "%s: %s, not a tuple (Horovod's)" % (name, type(outs))
        check_group(outs, inputs, op, dtype, name)
        if inplace:
            check_group(mine, inputs, op, dtype, name + " (input tensors)")
        else:
            for t, xs in zip(mine, inputs):
                assert_unchanged(t, xs[rank], name)

    # prescale / postscale apply to every tensor of the group.
    for dtype in FLOAT_DTYPES:
        for op in (hvd.Sum, hvd.Average):
            name = "gar.scale.%s.%s" % (op_name(op), dtype_name(dtype))
            inputs = group_inputs(name, op, dtype, size)
            outs = hvd.grouped_allreduce([xs[rank] for xs in inputs], name=name, op=op,
                                         prescale_factor=0.5, postscale_factor=3.0)
            check_group(outs, inputs, op, dtype, name, prescale=0.5, postscale=3.0)

    # A large group of small tensors (the shape of a model's gradients).
    shapes = [(i % 7 + 1, 3) if i % 2 else (i + 1,) for i in range(120)]
    inputs = group_inputs("gar.large", hvd.Sum, torch.float32, size, shapes)
    outs = hvd.grouped_allreduce([xs[rank] for xs in inputs], name="gar.large", op=hvd.Sum)
    check_group(outs, inputs, hvd.Sum, torch.float32, "gar.large")

    # Small tensors beside ones large enough to skip the fusion buffer (256 KiB and up),
    # one of them longer than a chunk (4 MiB): both paths in one fused batch, in place
    # and not, with scaling.
    mixed = [(5,), (70000,), (3, 1), (1300000,), (0,), (9,)]
    for dtype in (torch.float32, torch.float64, torch.int32, torch.float16):
        for op in (hvd.Sum, hvd.Average, hvd.Max):
            name = "gar.mixed.%s.%s" % (op_name(op), dtype_name(dtype))
            scaled = dtype.is_floating_point and op in (hvd.Sum, hvd.Average)
            scale = dict(prescale=0.5, postscale=3.0) if scaled else {}
            factors = {k + "_factor": v for k, v in scale.items()}
            inputs = group_inputs(name, op, dtype, size, mixed)
            mine = [xs[rank].clone() for xs in inputs]
            outs = hvd.grouped_allreduce(mine, name=name, op=op, **factors)
            check_group(outs, inputs, op, dtype, name, **scale)
            for t, xs in zip(mine, inputs):
                assert_unchanged(t, xs[rank], name)
            name += ".inplace"
            inputs = group_inputs(name, op, dtype, size, mixed)
            mine = [xs[rank].clone() for xs in inputs]
            hvd.grouped_allreduce_(mine, name=name, op=op, **factors)
            check_group(mine, inputs, op, dtype, name, **scale)

    # Default op is Average; unnamed groups pair up by call order.
    for i in range(3):
        inputs = group_inputs("gar.unnamed.%d" % i, hvd.Sum, torch.float64, size)
        outs = hvd.grouped_allreduce([xs[rank] for xs in inputs])
        check_group(outs, inputs, hvd.Average, torch.float64, "unnamed grouped_allreduce #%d" % i)
    hvd.shutdown()


main(body)
