"""Horovod's ``horovod.run`` on Perseus: after ``import perseus as horovod``,
``horovod.run(func, args=(...), np=2)`` runs ``func(*args, **kwargs)`` on that many ranks
through mpirun (the command perseusrun builds) and returns the values by rank, as
Horovod's horovod.run does over MPI.

The function and its arguments travel by pickle. A function of the running script
(``__main__``) is found in each rank as multiprocessing's spawn finds it: the script runs
there under the name ``__mp_main__``, so its ``if __name__ == "__main__":`` block does not,
and stands in for ``__main__`` while the payload is unpickled. Elastic runs (min/max
processes, host discovery), Gloo and horovodrun's ssh / NIC / output settings are not
available and raise ValueError.
"""

import os
import pickle
import runpy
import subprocess
import sys
import tempfile
import types
import warnings

PAYLOAD = "payload.pkl"
RESULT = "result.%d.pkl"
# Rank variables of the process managers perseusrun drives (Hydra, Open MPI).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        host_discovery_script=None, start_timeout=None, ssh_port=None, ssh_identity_file=None,
        disable_cache=None, output_filename=None, verbose=None, use_gloo=None, use_mpi=None,
        mpi_args=None, network_interface=None, network_interfaces=None, executable=None,
        np=None, min_np=None, max_np=None):
    """Horovod's horovod.run (same parameters): func(*args, **kwargs) on num_proc ranks
    -> [return value of rank 0, rank 1, ...]. A rank that fails makes it raise
    RuntimeError, as Horovod's MPI launch does. disable_cache is accepted: Perseus keeps
    no cache of horovodrun's checks, so it is always disabled."""
    for old, new, value in (("np", "num_proc", np), ("min_np", "min_num_proc", min_np),
                            ("max_np", "max_num_proc", max_np)):
        if value is not None:
            warnings.warn("%s is deprecated, use %s instead" % (old, new), DeprecationWarning)
    num_proc = np if np is not None else num_proc
    min_num_proc = min_np if min_np is not None else min_num_proc
    max_num_proc = max_np if max_np is not None else max_num_proc
    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile only allow one provided.")
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    if use_gloo:
        raise ValueError("use_gloo=True: Perseus runs over MPI only")
    refused = {"min_num_proc": min_num_proc, "max_num_proc": max_num_proc,
               "reset_limit": reset_limit, "cooldown_range": cooldown_range,
               "host_discovery_script": host_discovery_script, "slots": slots,
               "start_timeout": start_timeout,
               "ssh_port": ssh_port, "ssh_identity_file": ssh_identity_file,
               "output_filename": output_filename, "network_interface": network_interface,
               "network_interfaces": network_interfaces}
    given = sorted(name for name, value in refused.items() if value is not None)
    if given:
        raise ValueError("horovod.run on Perseus launches through mpirun and has no %s "
                         "(elastic runs and horovodrun's ssh, NIC and output settings)"
                         % ", ".join(given))

    from perseus import launcher
    command = [executable or sys.executable, "-m", __name__]
    with tempfile.TemporaryDirectory(prefix="perseus-run-") as work:
        write_payload(os.path.join(work, PAYLOAD), func, tuple(args), dict(kwargs or {}))
        argv = ["-np", str(num_proc)]
        argv += ["-H", hosts] if hosts else []
        argv += ["--hostfile", hostfile] if hostfile else []
        argv += ["--mpi-args", mpi_args] if mpi_args else []
        parsed = launcher.make_parser().parse_args(argv + command + [work])
        mpirun = launcher.find_mpirun()
        flavour = launcher.detect_flavour(mpirun)
        launcher.check_core_mpi(mpirun, flavour)  # another MPI's mpirun: say so, as perseusrun
        cmd = launcher.build_command(parsed, flavour, mpirun)
        if verbose:
            print("horovod.run: %s" % " ".join(cmd), file=sys.stderr, flush=True)
        code = subprocess.call(cmd, env=rank_environment())
        if code != 0:
            raise RuntimeError("mpirun failed with exit code %d" % code)
        # Objects of the script come back as __mp_main__'s, the script's name in the ranks.
        if "__main__" in sys.modules:
            sys.modules.setdefault("__mp_main__", sys.modules["__main__"])
        return [read_result(os.path.join(work, RESULT % rank)) for rank in range(num_proc)]


def main_script():
    """The path of the running script, if func may live in it; else None."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if path and path.endswith(".py") else None


def write_payload(path, func, args, kwargs):
    """Two pickles: what to set up before unpickling (script, sys.path), then the call."""
    with open(path, "wb") as f:
        pickle.dump({"main": main_script(), "sys_path": list(sys.path)}, f)
        pickle.dump((func, args, kwargs), f)


def rank_environment():
    """This environment, with this perseus importable in the ranks even when it was found
    through a sys.path entry that PYTHONPATH lacks."""
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def read_result(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def load_script_as_main(path):
    """Run the script as __mp_main__ and let it stand for __main__ (multiprocessing's
    spawn does the same), so that pickles of its functions and classes resolve."""
    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    sys.modules["__mp_main__"] = module
    module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    sys.modules["__main__"] = module


def rank_of_this_process():
    for name in RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    return 0


def rank_main(work):
    """A rank: load the payload, call the function, leave its return value for run()."""
    with open(os.path.join(work, PAYLOAD), "rb") as f:
        setup = pickle.load(f)
        sys.path[:] = setup["sys_path"]
        if setup["main"]:
            load_script_as_main(setup["main"])
        func, args, kwargs = pickle.load(f)
    result = func(*args, **kwargs)
    path = os.path.join(work, RESULT % rank_of_this_process())
    with open(path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    rank_main(sys.argv[1])
