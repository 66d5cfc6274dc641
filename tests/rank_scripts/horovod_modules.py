"""Horovod's submodule paths on Perseus's torch package (horovod.torch.mpi_ops and the
rest): importable, holding the package's own objects; `_basics`'s
_get_process_set_ids_and_ranks() is {id: ranks} of the registered sets on every rank;
gpu_available() answers for each front end."""
import importlib

import torch

from common import hvd, init, main

SUBMODULES = ["mpi_ops", "compression", "functions", "optimizer", "sync_batch_norm", "elastic",
              "elastic.sampler", "elastic.state"]


def check_paths():
    for name in SUBMODULES:
        module = importlib.import_module("perseus.torch.horovod." + name)
        for attr in ("allreduce", "synchronize", "Average", "DistributedOptimizer", "Compression",
                     "broadcast_parameters", "SyncBatchNorm", "size"):
            if name.startswith("elastic"):
                break  # the real elastic module: its own names (below)
            assert getattr(module, attr) is getattr(hvd, attr), (name, attr)
    from perseus.torch.horovod.mpi_ops import Average, synchronize  # as Horovod's scripts write it
    from perseus.torch.horovod.elastic.sampler import ElasticSampler
    from perseus.torch.horovod.elastic.state import TorchState
    assert synchronize is hvd.synchronize and Average is hvd.Average
    assert ElasticSampler is hvd.elastic.ElasticSampler and TorchState is hvd.elastic.TorchState
    assert hvd.mpi_ops is importlib.import_module("perseus.torch.horovod.mpi_ops")
    # Horovod's torch has is_homogeneous in mpi_ops and its _basics, not in the package
    from perseus.torch.horovod.mpi_ops import is_homogeneous
    assert is_homogeneous is hvd.mpi_ops._basics.is_homogeneous and is_homogeneous() is True


def check_ids_and_ranks(rank, size):
    ids_and_ranks = hvd.mpi_ops._basics._get_process_set_ids_and_ranks
    everyone = list(range(size))
    assert ids_and_ranks() == {0: everyone}, ids_and_ranks()
    evens, last = hvd.add_process_set(everyone[::2]), hvd.add_process_set([size - 1])
    expect = {0: everyone, evens.process_set_id: everyone[::2], last.process_set_id: [size - 1]}
    assert ids_and_ranks() == expect, (ids_and_ranks(), expect)
    # The same on every rank: ids and ranks gathered from all.
    assert hvd.allgather_object(sorted(ids_and_ranks().items())) == [sorted(expect.items())] * size
    del expect[evens.process_set_id]  # (removing it clears its id)
    hvd.remove_process_set(evens)
    assert ids_and_ranks() == expect
    hvd.remove_process_set(last)
    assert ids_and_ranks() == {0: everyone}


def check_gpu_available():
    usable = torch.cuda.is_available()
    assert hvd.gpu_available("torch") is usable and hvd.gpu_available("horovod.torch") is usable
    assert hvd.gpu_available("tensorflow") is False and hvd.gpu_available("mxnet") is False
    try:
        hvd.gpu_available("caffe2")
    except ValueError as e:
        assert "caffe2" in str(e)
    else:
        raise AssertionError("gpu_available('caffe2') did not raise")


def body():
    rank, size = init()
    check_paths()
    check_ids_and_ranks(rank, size)
    check_gpu_available()
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
