"""Whether a torch.distributed backend argument names backends torch knows.

torch takes any string as a backend and fails later, far from the typo ("environment
variable RANK expected" for init_process_group("perseu") under mpirun), and the drop-in
ignores the backend altogether. Both init_process_group wrappers ask check() first, so
a misspelling is a ValueError naming it, the names torch knows and the closest one.
"""

import difflib

import torch.distributed as _dist

NAME = "perseus"


def known():
    """The backend names torch knows now (those registered later, as "perseus" or
    oneCCL's "ccl" are, included), without torch's placeholder "undefined"."""
    names = [b for b in _dist.Backend.backend_list if b != _dist.Backend.UNDEFINED]
    return names if NAME in names else names + [NAME]


def check(backend, caller):
    """Raises ValueError when a string backend ("gloo", "cpu:gloo,cuda:nccl", any case)
    names one torch does not know; None and non-strings are left to the caller."""
    if not isinstance(backend, str):
        return
    names = known()
    for part in backend.split(","):
        name = part.rpartition(":")[2].strip().lower()
        if name in names:
            continue
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        hint = " (did you mean '%s'?)" % close[0] if close else ""
        raise ValueError(
            "%s(backend=%r): torch.distributed knows no backend '%s'%s. The backends it "
            "knows: %s; or one per device, e.g. 'cpu:gloo,cuda:nccl'. (\"perseus\" is "
            "registered by `import perseus`.)"
            % (caller, backend, name, hint, ", ".join(names)))
