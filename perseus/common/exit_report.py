"""How this process ends, told to the other ranks before it goes.

When a rank ends badly the launcher kills every other rank within milliseconds, so
the survivors can name it only if they hear first: the leaving rank's last
negotiation round says how it is ending, and each survivor's core prints it at once
and fails its requests naming it. The core itself reports fatal signals; this module
adds what only Python sees: os._exit(), which runs no exit hook, sys.exit(n) and an
uncaught exception, whose name says more than an exit code. A normal end says nothing.
"""

import os
import sys

from perseus.common import library as _lib

EXIT_SHUTDOWN_S = 10.0  # an exit waits this long for the engine, then leaves it
# os._exit() means "now": it waits less (peers in a collective hear within milliseconds;
# one that submits nothing for this long is killed by the launcher without a word).
OS_EXIT_SHUTDOWN_S = 3.0
_MAX_MESSAGE = 200  # of an uncaught exception's text, in the peers' warnings

_real_os_exit = os._exit
_real_sys_exit = sys.exit
_previous_excepthook = None
_owner = None  # the pid that installed the hooks: a forked child leaves nothing
_how = None    # set by the excepthook, told at exit


def leave(how, timeout_s=EXIT_SHUTDOWN_S):
    """Shuts Perseus down as an exit path, telling the peers `how`. Best effort and
    bounded: a failing or stuck shutdown must not turn an exit into a traceback or a
    hang."""
    try:
        if os.getpid() == _owner and _lib.perseus_is_initialized():
            _lib.perseus_leave(how.encode("utf-8", "replace"), timeout_s)
    except Exception:
        pass


def at_exit():
    """The end of the interpreter: a normal end says nothing ("": as shutdown() does;
    most scripts never call it), an uncaught exception or sys.exit(n != 0) says so."""
    leave(_how or "")


def _os_exit(code):
    leave("called os._exit(%r)" % (code,), OS_EXIT_SHUTDOWN_S)
    _real_os_exit(code)


def _sys_exit(code=None):
    global _how
    if code not in (None, 0):  # what the process will exit with, unless caught
        _how = "called sys.exit(%r)" % (code,)
    _real_sys_exit(code)


def _excepthook(kind, value, traceback):
    global _how
    text = str(value)
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + "..."
    _how = "ended with an uncaught %s%s" % (kind.__name__, ": " + text if text else "")
    _previous_excepthook(kind, value, traceback)


def install():
    """At init: once per process."""
    global _owner, _previous_excepthook
    if _owner == os.getpid():
        return
    _owner = os.getpid()
    os._exit = _os_exit
    sys.exit = _sys_exit
    if _previous_excepthook is None:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook
