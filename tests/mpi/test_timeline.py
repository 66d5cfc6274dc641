"""The timeline: events written by rank 0 under mpirun (tests/rank_scripts/timeline.py), a file
left by a SIGKILLed process, bad paths, and `python -m perseus.timeline_summary`."""
import json
import signal
import subprocess
import sys

import pytest

from support.jobs import REPO_ROOT, clean_env

pytestmark = pytest.mark.timeout(300)


def summary(path):
    result = subprocess.run([sys.executable, "-m", "perseus.timeline_summary", str(path)],
                            cwd=str(REPO_ROOT), env=clean_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def summary_rows(text):
    """{first column: other columns} of the summary's tensor table."""
    tensor_table = text.split("\n\n")[0].splitlines()
    assert tensor_table[0].split()[:2] == ["tensor", "op"], text
    return {line.split()[0]: line.split()[1:] for line in tensor_table[1:]}


@pytest.mark.mpi
def test_timeline_at_np2(run_mpi, tmp_path):
    run_mpi("timeline", 2, env={"PERSEUS_FUSION_THRESHOLD": "32", "PERSEUS_ALLREDUCE_STREAMS": "2"},
            timeout=120)
    for name in ("running.json", "closed.json"):  # left by rank 0: unterminated, then closed
        found = list(tmp_path.glob("*/" + name))
        assert len(found) == 1, found
        text = summary(found[0])
        rows = summary_rows(text)
        for tensor, op in [("allreduce.env.fused.0", "allreduce"), ("allreduce.env.ar5", "allreduce"),
                           ("broadcast.env.bc", "broadcast"), ("allgather.env.ag", "allgather"),
                           ("alltoall.env.a2a", "alltoall"), ("reducescatter.env.rs", "reducescatter")]:
            assert tensor in rows, "%s missing from the summary of %s:\n%s" % (tensor, name, text)
            assert rows[tensor][0] == op and rows[tensor][1] == "1", text
        assert rows["allreduce.env.ar5"][-1] == "256", text  # bytes: 64 float32
        assert "allreduce.env.solo" in rows and rows["allreduce.env.solo"][0] == "(set", text
        lanes = text.split("\n\n")[1].splitlines()
        assert lanes[0].split() == ["set", "lane", "batches", "tensors", "busy_ms", "bytes"], text
        assert {tuple(line.split()[:2]) for line in lanes[1:]} >= {("0", "0"), ("0", "1")}, text


KILLED = """
import os, signal, time, torch
import perseus.torch.horovod as hvd
hvd.init()
for step in range(20):
    hvd.grouped_allreduce([torch.ones(4), torch.ones(3)], name="grad")
    hvd.broadcast(torch.ones(2), 0, name="weights")
time.sleep(0.5)  # past the writer's flush interval
print("KILLING", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_killed_process_leaves_a_parseable_timeline(run_python, tmp_path):
    path = tmp_path / "killed.json"
    result = run_python(KILLED, env={"PERSEUS_TIMELINE": str(path)})
    assert result.returncode == -signal.SIGKILL and "KILLING" in result.stdout, \
        result.stdout + result.stderr
    text = path.read_text()
    assert text.startswith("[\n") and text.endswith("},\n"), text[-200:]
    events = json.loads(text[:-2] + "]")  # no closing bracket: viewers accept that
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"allreduce.grad.0", "allreduce.grad.1", "broadcast.weights"} <= names, names
    assert sum(e["name"] == "ALLREDUCE" for e in events) == 40, "2 tensors x 20 steps"
    rows = summary_rows(summary(path))
    assert rows["allreduce.grad.0"][:2] == ["allreduce", "20"], rows
    assert rows["broadcast.weights"][:2] == ["broadcast", "20"], rows
    assert rows["allreduce.grad.1"][-1] == str(20 * 12), rows


def test_summary_of_a_file_cut_mid_event(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('[\n{"name":"thread_name","ph":"M","pid":0,"tid":1,"args":{"name":"x"}},\n'
                    '{"name":"ALLREDUCE","ph":"X","pid":0,"tid":1,"ts":1.5,"dur":2000,'
                    '"args":{"lane":0,"bytes":8,"fused":1}},\n{"name":"ALLRED')
    rows = summary_rows(summary(path))
    assert rows["x"] == ["allreduce", "1", "0.000", "0.000", "2.000", "8"], rows
    (tmp_path / "empty.json").write_text("[\n")
    assert "tensor" in summary(tmp_path / "empty.json")


def test_summary_counts_dropped_events(tmp_path):
    marker = '{"name":"TIMELINE_DROPPED","ph":"i","s":"g","pid":0,"tid":0,"ts":%d,"args":{"events":%d}},\n'
    path = tmp_path / "dropped.json"
    path.write_text("[\n" + marker % (10, 5) + marker % (20, 2))
    assert "7 events were dropped" in summary(path)
    path.write_text("[\n")
    assert "dropped" not in summary(path)


API = """
import sys, torch
import perseus.torch.horovod as hvd
try:
    hvd.start_timeline(sys.argv[1] if len(sys.argv) > 1 else "/tmp/x.json")
except ValueError as e:
    print("BEFORE_INIT:", e)
try:
    hvd.init()
except ValueError as e:
    print("INIT_FAILED:", e)
    sys.exit(0)
try:
    hvd.start_timeline("%s")
except ValueError as e:
    print("START_FAILED:", e)
hvd.allreduce(torch.ones(2), name="still.works")
hvd.shutdown()
print("DONE")
"""


def test_bad_timeline_paths(run_python, tmp_path):
    missing_dir = str(tmp_path / "no" / "such" / "dir" / "t.json")
    result = run_python(API % missing_dir, env={"HOROVOD_TIMELINE": missing_dir})
    assert "BEFORE_INIT:" in result.stdout and "init()" in result.stdout, result.stdout + result.stderr
    assert "INIT_FAILED:" in result.stdout and "HOROVOD_TIMELINE" in result.stdout \
        and missing_dir in result.stdout, result.stdout + result.stderr
    result = run_python(API % missing_dir)
    assert "START_FAILED:" in result.stdout and missing_dir in result.stdout, result.stdout + result.stderr
    assert "DONE" in result.stdout, result.stdout + result.stderr


def test_timeline_setting_in_config(run_python, tmp_path):
    code = ("import perseus.common.basics as b\n"
            "try:\n    b.init()\nexcept ValueError as e:\n    print('INIT_FAILED:', e)\n"
            "print(b.config().get('PERSEUS_TIMELINE_MARK_CYCLES'))")
    result = run_python(code, env={"HOROVOD_TIMELINE_MARK_CYCLES": "maybe"})
    assert "HOROVOD_TIMELINE_MARK_CYCLES='maybe' is invalid" in result.stdout, \
        result.stdout + result.stderr
    result = run_python(code, env={"PERSEUS_TIMELINE_MARK_CYCLES": "yes"})
    assert result.stdout.strip() == "1", result.stdout + result.stderr
