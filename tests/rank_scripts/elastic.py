"""hvd.elastic for PyTorch on the fixed MPI world: TorchState / ObjectState sync,
commit and restore, run() retrying after a HorovodInternalError (injected, and a
real collective failure), reset callbacks, ElasticSampler, and the resize error.

References are plain torch: rank r's model is built from seed r, so every rank
rebuilds rank 0's; a training step moves each weight by -lr x the mean over the
ranks of (r + 1) x (epoch + 1), which every rank computes itself.
"""
import torch

from common import hvd, log, main

LR = 0.1


def build(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model.register_buffer("steps", torch.zeros(1))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    return model, opt


def params(model):
    return [t.detach().clone() for t in model.state_dict().values()]


def assert_same(actual, expected, what):
    assert len(actual) == len(expected), what
    for a, e in zip(actual, expected):
        if not torch.equal(a, e):
            raise AssertionError("%s: got %r, expected %r" % (what, a, e))


def step(model, opt, epoch, rank, size):
    """One SGD step with the averaged gradient (r + 1) x (epoch + 1) of every rank."""
    opt.zero_grad()
    for p in model.parameters():
        p.grad = torch.full_like(p, float((rank + 1) * (epoch + 1)))
        p.grad = hvd.allreduce(p.grad)
    opt.step()
    model.steps += 1


def reference(epochs, size):
    """Rank 0's model trained for `epochs` steps without failures (one process)."""
    model, opt = build(0)
    for epoch in range(epochs):
        opt.zero_grad()
        for p in model.parameters():
            p.grad = torch.full_like(p, sum((r + 1) * (epoch + 1) for r in range(size)) / size)
        opt.step()
        model.steps += 1
    return model, opt


def check_sync_commit_restore(rank, size):
    model, opt = build(rank)
    state = hvd.elastic.TorchState(model, opt, epoch=10 * rank, batch=rank, note=[rank])
    assert state.model is model and state.optimizer is opt
    state.sync()  # rank 0's model, optimizer and values on every rank
    assert_same(params(model), params(build(0)[0]), "sync: rank 0's model")
    assert (state.epoch, state.batch, state.note) == (0, 0, [0]), vars(state)
    # The synced values are the committed ones: restore() returns to rank 0's, not to
    # this rank's from before the sync.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank + 1)
    state.epoch = 7
    state.restore()
    assert_same(params(model), params(build(0)[0]), "restore after sync: rank 0's model")
    assert state.epoch == 0, vars(state)

    step(model, opt, 0, rank, size)
    state.epoch, state.batch = 1, 5
    state.commit()
    committed = params(model)
    committed_momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    # Uncommitted changes, different on every rank, are rolled back by restore().
    step(model, opt, 1, rank, size)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank + 1)
    state.epoch, state.batch = 99, 99
    state.restore()
    assert_same(params(model), committed, "restore: committed model")
    assert_same([opt.state[p]["momentum_buffer"] for p in model.parameters()],
                committed_momentum, "restore: committed optimizer state")
    assert (state.epoch, state.batch) == (1, 5), vars(state)
    ref_model, _ = reference(1, size)
    assert_same(params(model), params(ref_model), "restore: reference after one step")

    # A plain ObjectState, and model=None / optimizer=None as plain attributes.
    obj = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, x=rank, y="r%d" % rank)
    obj.sync()
    assert (obj.x, obj.y) == (0, "r0"), vars(obj)
    empty = hvd.elastic.TorchState(value=rank)
    assert empty.model is None and empty.optimizer is None
    empty.sync()
    assert empty.value == 0


def train_with_failure(rank, size, fail):
    """run() over 4 epochs; `fail(state)` breaks the first attempt after epoch 1's
    commit. Returns (result, attempts' first epochs, resets seen, state)."""
    model, opt = build(rank)
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    attempts, resets = [], []
    state.register_reset_callbacks([lambda: resets.append(state.epoch)])

    @hvd.elastic.run
    def train(state, epochs):
        attempts.append(state.epoch)
        for epoch in range(state.epoch, epochs):
            step(state.model, state.optimizer, epoch, rank, size)
            state.epoch = epoch + 1
            state.commit()
            if epoch == 1 and len(attempts) == 1:
                step(state.model, state.optimizer, 7, rank, size)  # lost with the failure
                state.epoch = 42
                fail(state)
        return "done after %d" % state.epoch

    return train(state, 4), attempts, resets, state


def check_run_retries(rank, size):
    def injected(state):
        raise hvd.HorovodInternalError("injected failure")

    def mismatch(state):
        # A real collective failure: shapes differ across ranks, so the core
        # reports it on every rank as a HorovodInternalError.
        hvd.allreduce(torch.ones(rank + 1), name="elastic_mismatch")

    ref_model, _ = reference(4, size)
    for fail in (injected, mismatch):
        result, attempts, resets, state = train_with_failure(rank, size, fail)
        assert result == "done after 4", result
        assert attempts == [0, 2], (fail.__name__, attempts)  # resumed from the commit
        assert resets == [2], (fail.__name__, resets)  # after restore, before the sync
        assert_same(params(state.model), params(ref_model), fail.__name__ + ": trained model")
        log("run retried after", fail.__name__)
    assert hvd.is_initialized()


def split(remaining, rank, size):
    """Rank `rank`'s share of `remaining` unshuffled: padded by repeating from the
    start to a multiple of size, then every size-th index."""
    n = -(-len(remaining) // size) * size
    padded = (remaining * size)[:n] if remaining else []
    return padded[rank::size]


def check_elastic_sampler(rank, size):
    data = list(range(10))
    sampler = hvd.elastic.ElasticSampler(data, shuffle=False)
    assert list(sampler) == split(data, rank, size) and len(sampler) == -(-10 // size)
    shuffled = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
    shares = hvd.allgather_object(list(shuffled))
    assert sorted(set(sum(shares, []))) == data and list(shuffled) == shares[rank], shares
    shuffled.set_epoch(1)
    assert hvd.allgather_object(list(shuffled)) != shares  # another order next epoch

    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    assert state.sampler is sampler
    iter(sampler)
    sampler.record_batch(0, 2)
    state.commit()
    sampler.record_batch(1, 2)
    state.restore()
    assert sampler.processed_indices == set(split(data, rank, size)[:2]), sampler.processed_indices
    state.sync()  # every rank's processed samples are left out on every rank
    done = set().union(*[split(data, r, size)[:2] for r in range(size)])
    remaining = [i for i in data if i not in done]
    assert sampler.processed_indices == done, sampler.processed_indices
    assert list(sampler) == split(remaining, rank, size), (list(sampler), remaining)
    sampler.set_epoch(1)
    assert sampler.processed_indices == set() and list(sampler) == split(data, rank, size)


def check_resize_refused(rank, size):
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=0)

    @hvd.elastic.run
    def train(state):
        from perseus.common.exceptions import HostsUpdatedInterrupt
        raise HostsUpdatedInterrupt(skip_sync=False)

    try:
        train(state)
    except NotImplementedError as e:
        assert "--min-np" in str(e) and "fixed world" in str(e), e
    else:
        raise AssertionError("a resize request was not refused")


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for check in (check_sync_commit_restore, check_run_retries, check_elastic_sampler,
                  check_resize_refused):
        check(rank, size)
        log(check.__name__, "passed")
    hvd.shutdown()


main(body)
