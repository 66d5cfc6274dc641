"""barrier(): no rank leaves before every rank has arrived, globally and within a process
set. Arrival is recorded in files, outside the library; the last rank arrives late."""
import time

from common import exists, hvd, init, main, touch


def check_barrier(round_name, members, rank, process_set):
    latecomer = members[-1]
    if rank == latecomer:
        time.sleep(0.3)
    touch("%s.arrived.%d" % (round_name, rank))
    if process_set is None:
        hvd.barrier()
    else:
        hvd.barrier(process_set=process_set)
    missing = [r for r in members if not exists("%s.arrived.%d" % (round_name, r))]
    assert not missing, "%s: left the barrier before ranks %s arrived" % (round_name, missing)


def body():
    rank, size = init()
    everyone = list(range(size))
    for i in range(3):
        check_barrier("global.%d" % i, everyone, rank, None)

    # The same within a process set; ranks outside it do not take part.
    first_half = list(range(max(1, size // 2)))
    second_half = [r for r in everyone if r not in first_half]
    ps_first = hvd.add_process_set(first_half)
    ps_second = hvd.add_process_set(second_half)
    for i in range(2):
        if rank in first_half:
            check_barrier("first.%d" % i, first_half, rank, ps_first)
        else:
            check_barrier("second.%d" % i, second_half, rank, ps_second)
    check_barrier("global.end", everyone, rank, hvd.global_process_set)
    hvd.remove_process_set(ps_first)
    hvd.remove_process_set(ps_second)
    hvd.shutdown()


main(body)
