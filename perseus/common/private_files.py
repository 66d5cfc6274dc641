"""Files that Perseus and its examples write and later read back (checkpoints, the cache
of natively built libraries), kept where no one else can plant or swap them.

A folder qualifies when it is a real directory, not a symbolic link, owned by this user
and writable by no one else: then only this user (or root) can put a file or link in it.
A write goes to a fresh file in that folder (tempfile.mkstemp: O_EXCL | O_NOFOLLOW, mode
0600), which os.replace then moves onto the name, so a crash leaves the old file whole.
A name that is a link, or a file of another user, is refused for writing and reading.
"""

import contextlib
import os
import stat
import tempfile


class UnsafePathError(PermissionError):
    """A file or folder Perseus will not write or read; the message says why."""


def cache_dir():
    """Perseus's cache folder: $XDG_CACHE_HOME/perseus, else ~/.cache/perseus."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "perseus")


def default_checkpoint(name):
    """Where an example keeps its checkpoint `name` unless told otherwise."""
    return os.path.join(cache_dir(), "checkpoints", name)


LINK = "it is a symbolic link, which Perseus does not follow here"


def _problem(st, folder):
    """What disqualifies a folder (or, folder=False, a file) with this stat result, or None."""
    if stat.S_ISLNK(st.st_mode):
        return LINK
    if not (stat.S_ISDIR if folder else stat.S_ISREG)(st.st_mode):
        return "it is not a %s" % ("folder" if folder else "regular file")
    if st.st_uid != os.geteuid():
        return "it belongs to uid %d, not to this user (uid %d)" % (st.st_uid, os.geteuid())
    if folder and st.st_mode & 0o022:
        return ("group or others may write in it (mode %03o), so they could plant a link or "
                "a file there; `chmod go-w` it" % stat.S_IMODE(st.st_mode))
    return None


def _make_folders(folder):
    """Creates folder and its missing parents, each mode 0700 (os.makedirs would give the
    parents the umask's mode, under which a later private_folder(parent) may fail)."""
    parent = os.path.dirname(folder)
    if parent != folder and not os.path.lexists(parent):
        _make_folders(parent)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass


def private_folder(folder, create=True):
    """Returns folder, created (mode 0700, with its missing parents) if missing and
    `create`; raises UnsafePathError unless it is a directory of this user's that no one
    else can write."""
    if create and not os.path.lexists(folder):
        _make_folders(os.path.abspath(folder))
    why = _problem(os.lstat(folder), folder=True)
    if why:
        raise UnsafePathError("refusing to use the folder %s: %s. Use a folder of your own "
                              "that only you can write." % (folder, why))
    return folder


def check_writable(path):
    """Raises UnsafePathError unless `path` may be (re)written by replace_privately: its
    folder is private (created if missing) and the name is no link or other's file."""
    private_folder(os.path.dirname(os.path.abspath(path)))
    try:
        why = _problem(os.lstat(path), folder=False)
    except FileNotFoundError:
        return
    if why:
        raise UnsafePathError("refusing to write %s: %s" % (path, why))


@contextlib.contextmanager
def replace_privately(path):
    """Yields a new binary file in path's folder; when the block ends without an error it
    becomes `path` (atomically), else it is removed and `path` is left as it was."""
    check_writable(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=".%s." % os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def open_private(path):
    """path opened for binary reading; raises UnsafePathError if its folder is not
    private, or it is a link, not a regular file, or another user's."""
    private_folder(os.path.dirname(os.path.abspath(path)), create=False)
    try:
        # O_NONBLOCK: a FIFO planted at the name must not block the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        if os.path.islink(path):  # O_NOFOLLOW's ELOOP
            raise UnsafePathError("refusing to read %s: %s" % (path, LINK)) from None
        raise
    why = _problem(os.fstat(fd), folder=False)
    if why:
        os.close(fd)
        raise UnsafePathError("refusing to read %s: %s" % (path, why))
    return os.fdopen(fd, "rb")
