"""Totals from a Perseus timeline, for people who would rather read a table.

    python -m perseus.timeline_summary FILE

FILE is what PERSEUS_TIMELINE / start_timeline() wrote: a Chrome-trace JSON array.
A timeline still being written, or left by a crashed run, has no closing bracket;
it is read all the same (a line cut short is skipped).

Per tensor: how many times it ran, the time spent negotiating (submit until every
rank agreed), queued for its lane, executing (the collective with its packing and
unpacking), and the bytes it carried. Per lane: the batches it ran (fused tensors
count once), its busy time and bytes. Events the recorder dropped because its
buffer was full (TIMELINE_DROPPED markers) are counted at the end.
"""
import json
import sys
from collections import defaultdict

# Activities that are the collective itself (csrc/src/common/timeline.cc, kExecute).
EXECUTE = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN"}


def load_events(path):
    """The events of a timeline file, terminated or not."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    body = text.rstrip()
    if not body.endswith("]"):
        body = body.rstrip(",") + "]"
    try:
        return json.loads(body)
    except ValueError:
        pass
    # Cut mid-line (or otherwise damaged): keep every line that is a whole event.
    events = []
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def summarize(events):
    """(tensors, lanes): {(set, tensor name): totals}, {(set, lane): totals}.
    Times are in milliseconds."""
    names = {}  # (pid, tid) -> tensor name, from the thread_name metadata
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "")
    tensors = defaultdict(lambda: {"op": "", "count": 0, "negotiate_ms": 0.0, "queued_ms": 0.0,
                                   "execute_ms": 0.0, "bytes": 0})
    lanes = defaultdict(lambda: {"batches": 0, "tensors": 0, "busy_ms": 0.0, "bytes": 0})
    batches_seen = set()
    for e in events:
        if e.get("ph") != "X":
            continue
        key = (e.get("pid"), e.get("tid"))
        if key not in names or e.get("tid") == 0:
            continue
        row = tensors[(key[0], names[key])]
        ms = float(e.get("dur", 0)) / 1000.0
        name = e.get("name", "")
        args = e.get("args", {})
        if name.startswith("NEGOTIATE_"):
            row["negotiate_ms"] += ms
        elif name == "QUEUED":
            row["queued_ms"] += ms
        elif name in EXECUTE:
            row["op"] = name.lower()
            row["count"] += 1
            row["execute_ms"] += ms
            row["bytes"] += int(args.get("bytes", 0))
            lane = lanes[(key[0], args.get("lane", -1))]
            lane["tensors"] += 1
            lane["bytes"] += int(args.get("bytes", 0))
            # A fused batch puts the same span on each of its tensors: count it once.
            batch = (key[0], args.get("lane"), e.get("ts"), e.get("dur"))
            if batch not in batches_seen:
                batches_seen.add(batch)
                lane["batches"] += 1
                lane["busy_ms"] += ms
    return dict(tensors), dict(lanes)


def _table(header, rows):
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(x).rjust(w) if i else str(x).ljust(w)
                       for i, (x, w) in enumerate(zip(row, widths)))
             for row in [header] + rows]
    return "\n".join(lines)


def format_summary(tensors, lanes):
    tensor_rows = [[name if pset == 0 else "%s (set %s)" % (name, pset), t["op"], t["count"],
                    "%.3f" % t["negotiate_ms"], "%.3f" % t["queued_ms"], "%.3f" % t["execute_ms"],
                    t["bytes"]]
                   for (pset, name), t in sorted(tensors.items(), key=lambda kv: (kv[0][0], kv[0][1]))]
    lane_rows = [[pset, lane, t["batches"], t["tensors"], "%.3f" % t["busy_ms"], t["bytes"]]
                 for (pset, lane), t in sorted(lanes.items())]
    return (_table(["tensor", "op", "count", "negotiate_ms", "queued_ms", "execute_ms", "bytes"],
                   tensor_rows)
            + "\n\n"
            + _table(["set", "lane", "batches", "tensors", "busy_ms", "bytes"], lane_rows))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m perseus.timeline_summary FILE", file=sys.stderr)
        return 2
    try:
        events = load_events(argv[0])
    except OSError as e:
        print("cannot read %s: %s" % (argv[0], e), file=sys.stderr)
        return 1
    print(format_summary(*summarize(events)))
    dropped = sum(int(e.get("args", {}).get("events", 0))
                  for e in events if e.get("name") == "TIMELINE_DROPPED")
    if dropped:
        print("\n%d events were dropped (the writer fell behind); totals above miss them" % dropped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
