"""`import perseus as horovod; horovod.run(func, args, np=N)` (Horovod's examples call it
with --num-proc): func runs on N ranks through mpirun and the values come back by rank."""
import ast
import sys
import textwrap

import pytest

import perseus
from support.jobs import clean_env, run_bounded

SCRIPT = textwrap.dedent("""
    import math
    import sys
    import perseus as horovod

    print("top level", flush=True)


    class Reply:  # a class of the script, pickled back from the ranks
        def __init__(self, rank, size, total):
            self.value = (rank, size, total)


    def work(scale, offset=0):
        import torch
        import perseus.torch.horovod as hvd
        hvd.init()
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
        return Reply(hvd.rank(), hvd.size(), total * scale + offset)


    def fail_on_rank_1():
        import perseus.torch.horovod as hvd
        hvd.init()
        if hvd.rank() == 1:
            raise SystemExit(3)
        return hvd.rank()


    if __name__ == "__main__":
        np = int(sys.argv[1])
        replies = horovod.run(work, args=(10,), kwargs={"offset": 1}, np=np)
        print("RESULT", [r.value for r in replies])
        print("FACTORIAL", horovod.run(math.factorial, args=(5,), num_proc=np))
        try:
            horovod.run(fail_on_rank_1, num_proc=np)
        except RuntimeError as e:
            print("FAILED", e)
""")


def result_line(out, tag):
    line = next(l for l in out.splitlines() if l.startswith(tag + " "))
    return line[len(tag) + 1:]


@pytest.mark.mpi
@pytest.mark.parametrize("np", [2, 4])
def test_run_returns_each_ranks_value(tmp_path, np):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    code, out, err, _ = run_bounded([sys.executable, script, np], clean_env(), timeout=240)
    assert code == 0, out + err
    total = sum(range(1, np + 1))
    assert ast.literal_eval(result_line(out, "RESULT")) == [
        (rank, np, total * 10.0 + 1) for rank in range(np)]
    assert ast.literal_eval(result_line(out, "FACTORIAL")) == [120] * np
    assert result_line(out, "FAILED") == "mpirun failed with exit code 3", out + err
    # The ranks load the script as __mp_main__: its top level runs there, its
    # `if __name__ == "__main__":` block only in the launching process.
    assert out.count("top level") == 1 + 3 * np, out
    assert out.count("RESULT") == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"use_gloo": True}, "MPI only"),
    ({"use_gloo": True, "use_mpi": True}, "only allow one"),
    ({"start_timeout": 30}, "has no start_timeout"),
    ({"hosts": "a:1", "hostfile": "f"}, "only allow one"),
    ({"ssh_port": 22}, "has no ssh_port"),
])
def test_run_refuses_what_it_cannot_do(kwargs, message):
    with pytest.raises(ValueError, match=message):
        perseus.run(len, args=([],), **kwargs)


def test_run_warns_of_horovods_deprecated_names_and_takes_them():
    with pytest.warns(DeprecationWarning, match="min_np is deprecated, use min_num_proc"):
        with pytest.raises(ValueError, match="has no min_num_proc"):
            perseus.run(len, args=([],), min_np=1)
