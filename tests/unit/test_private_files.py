"""perseus.common.private_files (issue 37, point 4): checkpoints and the native-build
cache are written and read only in folders of this user's that no one else can write,
never through a symbolic link, never from another user's file."""
import os
import re
import stat

import pytest

from perseus.common import native_build, private_files
from perseus.common.private_files import UnsafePathError

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a file to another user")


@pytest.fixture
def folder(tmp_path):
    """A private folder: this user's, mode 0700."""
    path = tmp_path / "ck"
    path.mkdir(mode=0o700)
    return path


def write(path, data):
    with private_files.replace_privately(str(path)) as f:
        f.write(data)


def read(path):
    with private_files.open_private(str(path)) as f:
        return f.read()


def test_round_trip_is_private_and_atomic(folder):
    target = folder / "model.pt"
    write(target, b"one")
    assert read(target) == b"one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(RuntimeError):
        with private_files.replace_privately(str(target)) as f:
            f.write(b"half")
            raise RuntimeError("the save failed")
    assert read(target) == b"one"  # the old file is whole, no temporary file is left
    assert sorted(p.name for p in folder.iterdir()) == ["model.pt"]


def test_missing_folders_are_created_private(tmp_path):
    target = tmp_path / "cache" / "perseus" / "checkpoints" / "model.pt"
    old = os.umask(0o002)  # a umask that leaves folders group-writable
    try:
        write(target, b"x")
    finally:
        os.umask(old)
    for folder in (target.parent, target.parent.parent, target.parent.parent.parent):
        st = folder.stat()
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700, folder
    private_files.private_folder(str(target.parent.parent))  # the cache folder: private too


def test_write_refuses_a_link_and_leaves_its_target(folder, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (folder / "model.pt").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="model.pt: it is a symbolic link"):
        write(folder / "model.pt", b"overwritten")
    assert victim.read_bytes() == b"precious"
    assert sorted(p.name for p in folder.iterdir()) == ["model.pt"]


@pytest.mark.parametrize("problem", ["link", "group-writable", "world-writable",
                                     pytest.param("other user's", marks=as_root)])
def test_unsafe_folder_is_refused_for_writing_and_reading(tmp_path, problem):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (real / "model.pt").write_bytes(b"x")
    folder = tmp_path / "ck"
    if problem == "link":
        folder.symlink_to(real)
        why = "it is a symbolic link"
    else:
        real.rename(folder)
        if problem == "other user's":
            os.chown(folder, NOBODY, -1)
            why = "it belongs to uid %d" % NOBODY
        else:
            folder.chmod(0o770 if problem == "group-writable" else 0o1777)
            why = "group or others may write in it"
    with pytest.raises(UnsafePathError, match=re.escape("the folder %s: %s" % (folder, why))):
        write(folder / "model.pt", b"y")
    with pytest.raises(UnsafePathError, match=why):
        read(folder / "model.pt")
    assert (real if problem == "link" else folder).joinpath("model.pt").read_bytes() == b"x"


def test_read_refuses_a_link(folder, tmp_path):
    mine = tmp_path / "elsewhere.pt"
    mine.write_bytes(b"x")
    (folder / "model.pt").symlink_to(mine)
    with pytest.raises(UnsafePathError, match="read .*model.pt: it is a symbolic link"):
        read(folder / "model.pt")


@as_root
def test_other_users_file_is_refused(folder):
    target = folder / "model.pt"
    target.write_bytes(b"theirs")
    os.chown(target, NOBODY, -1)
    with pytest.raises(UnsafePathError, match="read .*model.pt: it belongs to uid %d" % NOBODY):
        read(target)
    with pytest.raises(UnsafePathError, match="write .*model.pt: it belongs to uid %d" % NOBODY):
        write(target, b"mine")
    assert target.read_bytes() == b"theirs"


def test_fifo_is_refused_without_blocking(folder):
    os.mkfifo(folder / "model.pt")
    with pytest.raises(UnsafePathError, match="not a regular file"):
        read(folder / "model.pt")


def test_default_checkpoint_is_in_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert private_files.default_checkpoint("a.pt") == str(tmp_path / ".cache/perseus/checkpoints/a.pt")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert private_files.default_checkpoint("a.pt") == str(tmp_path / "xdg/perseus/checkpoints/a.pt")


def test_native_build_refuses_a_cache_others_can_write(tmp_path, monkeypatch):
    """A library found in the cache is loaded into the process: a cache folder that
    others can write is refused before anything is looked up or built there."""
    include = tmp_path / "include"
    (include / "perseus").mkdir(parents=True)
    (include / "perseus" / "perseus.h").write_text("")
    (tmp_path / "x.cc").write_text("")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    monkeypatch.setenv("PERSEUS_TEST_CACHE", str(cache))
    build = native_build.CachedBuild("the test library", str(tmp_path / "x.cc"), str(include),
                                     "PERSEUS_TEST_CACHE", "x")
    open(build.path(), "wb").close()  # a library someone planted
    with pytest.raises(ImportError, match=re.escape("cannot load the test library: refusing to use the "
                                                    "folder %s: group or others may write" % cache)):
        build.ensure()
