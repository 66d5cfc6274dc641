#!/usr/bin/env python
"""Checks that the core's #include arrows run one way: down the layers of csrc/.

Each directory of csrc/src (a file directly in it, such as c_api.cc, by its stem) and
csrc/include is a layer, and so is each subfolder of one that LAYERS names as
"folder/sub" (cuda/'s runtime/, context/, memory/, staged/, nccl/; the files directly in
cuda/ are layer cuda). LAYERS names each, lowest first, with the layers it stands on
directly. A file may include its own layer and every layer below it, following those
lists down; any other #include "..." is reported with its file, line and both layers,
and so is a file outside every declared layer or an include that names no file.

Why a graph and not one rank per layer: lanes/ must see cuda/, and the engine must not
(it knows lanes only through lane_api/), so cuda/ can be neither below nor beside the
engine in a single order. Layers that neither stands on, such as lanes/ and engine/,
may not include each other.

  python scripts/check_layers.py [--root REPO] [--order]

Exit status 0 when every arrow runs down, 1 otherwise. --order prints the layers,
lowest first, with what each stands on.
"""
import argparse
import os
import re
import sys

# Lowest first; each layer with the layers it stands on directly.
LAYERS = [
    ("include", []),                 # csrc/include/perseus/perseus.h: the C ABI
    ("common", ["include"]),         # status, dtypes, requests, batches, clock, logging, timeline
    ("mpi", ["common"]),             # what wraps MPI: status, lock, wait policy, node communicators
    ("collectives", ["mpi"]),        # the MPI algorithms on host buffers
    # cuda/, the GPU backend, by purpose, lowest first (what each subfolder holds:
    # docs/ARCHITECTURE.md); the files directly in cuda/ on top: the backend that lanes/
    # and the C ABI see, and the device batch runner.
    ("cuda/runtime", ["common"]),    # CUDA and NCCL loaded at run time, device guard, events
    ("cuda/context", ["cuda/runtime"]),  # what a lane's ops share: context, buffers, launch turn
    ("cuda/memory", ["cuda/context"]),  # packing and unpacking: the pack kernel, its fallbacks
    ("cuda/staged", ["cuda/context", "collectives"]),  # host-staged ops: the MPI algorithms
    ("cuda/nccl", ["cuda/memory", "cuda/staged", "mpi"]),  # one NCCL op per collective
    ("cuda", ["cuda/nccl"]),         # the device backend and batch runner
    ("lane_api", ["common"]),        # the Lane interface and the LaneFactory the engine is handed
    ("lanes", ["cuda", "lane_api"]),  # the MPI lane, the device lane, their worker, the factory
    ("engine", ["mpi", "lane_api"]),  # the scheduler: negotiation, fusion planning, process sets
    ("c_api", ["lanes", "engine"]),  # the C ABI's implementation: hands the engine the lanes
]

SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def below(layers):
    """layer -> every layer it may include (itself and all it stands on, transitively)."""
    reach = {}
    for name, stands_on in layers:
        for lower in stands_on:
            if lower not in reach:
                raise ValueError("layer %s stands on %s, which is not declared before it"
                                 % (name, lower))
        reach[name] = {name}.union(*(reach[lower] for lower in stands_on))
    return reach


def layer_of(csrc, path, declared=()):
    """The layer of a file under csrc/, or None where no directory names one: its
    subfolder's ("cuda/nccl") where `declared` names that, else its folder's."""
    rel = os.path.relpath(path, csrc).split(os.sep)
    if rel[0] == "include":
        return "include"
    if rel[0] == "src":
        if len(rel) > 3 and "/".join(rel[1:3]) in declared:
            return "/".join(rel[1:3])
        return os.path.splitext(rel[1])[0] if len(rel) == 2 else rel[1]
    return None


def resolve(csrc, including_file, target):
    """The file an #include "target" reads: beside the including file, else on the
    build's include path (csrc/src, then csrc/include, as setup.py orders it)."""
    for base in (os.path.dirname(including_file), os.path.join(csrc, "src"),
                 os.path.join(csrc, "include")):
        candidate = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(candidate):
            return candidate
    return None


def sources(csrc):
    for top in ("src", "include"):
        for folder, dirs, files in os.walk(os.path.join(csrc, top)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(SOURCE_SUFFIXES):
                    yield os.path.join(folder, name)


def check(root, layers=LAYERS):
    """The arrows that do not run down, as lines of text (empty when all do)."""
    csrc = os.path.join(root, "csrc")
    reach = below(layers)
    problems = []
    for path in sources(csrc):
        shown = os.path.relpath(path, root)
        mine = layer_of(csrc, path, reach)
        if mine not in reach:
            problems.append("%s: in no declared layer (%r); add it to LAYERS in %s"
                            % (shown, mine, os.path.relpath(__file__, root)))
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                target = match.group(1)
                found = resolve(csrc, path, target)
                if found is None:
                    problems.append('%s:%d: #include "%s" names no file under csrc/'
                                    % (shown, number, target))
                    continue
                theirs = layer_of(csrc, found, reach)
                if theirs in reach[mine]:
                    continue
                if theirs in reach and mine in reach[theirs]:
                    how = "runs up: %s stands on %s" % (theirs, mine)
                elif theirs in reach:
                    how = "runs across: %s is not below %s" % (theirs, mine)
                else:
                    how = "%s is in no declared layer" % os.path.relpath(found, root)
                problems.append('%s:%d: #include "%s": layer %s -> layer %s %s'
                                % (shown, number, target, mine, theirs, how))
    return problems


def order_text(layers=LAYERS):
    return "\n".join("%-12s stands on %s" % (name, ", ".join(on) or "nothing")
                     for name, on in layers)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the repository (default: this script's)")
    parser.add_argument("--order", action="store_true", help="print the layers, lowest first")
    args = parser.parse_args(argv)
    if args.order:
        print(order_text())
    problems = check(args.root)
    for problem in problems:
        print(problem)
    print("%d include arrow(s) not running down the layers" % len(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
