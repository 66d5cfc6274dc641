"""hvd.elastic.ElasticSampler: a DistributedSampler that remembers which samples
of the epoch were processed, so training resumed from a commit does not see them
again in that epoch. TorchState tracks one given as a keyword value."""

import math

import torch

from perseus.common import basics


class ElasticSampler(torch.utils.data.Sampler):
    """Splits the dataset's not yet processed indices of this epoch over the ranks
    (shuffled by seed + epoch when `shuffle`; padded by repeating indices so every
    rank gets as many). Call record_batch(batch_idx, batch_size) after each batch,
    and set_epoch(epoch) at each epoch's start."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks this rank's batch `batch_idx` (of `batch_size`) as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's dataset indices of batch `batch_idx`."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": self.processed_indices}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self):
        """Re-splits the remaining indices (after a restore or a new epoch)."""
        self.num_replicas = basics.size()
        self.rank = basics.rank()
        self.remaining_indices = [i for i in range(len(self.dataset))
                                  if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._split()

    def _split(self):
        indices = list(self.remaining_indices)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices = [indices[i] for i in torch.randperm(len(indices),
                                                          generator=generator).tolist()]
        if indices:  # pad to a multiple of the ranks by repeating from the start
            indices += (indices * math.ceil(self.total_size / len(indices)))[
                :self.total_size - len(indices)]
        return indices[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        self.indices = self._split()
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
