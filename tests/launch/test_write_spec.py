"""`up` writes its launch spec under the user cache folder before it creates anything: a cache
folder that cannot take it (XDG_CACHE_HOME a file, read-only, full) is one error line naming the
file, and nothing is left behind."""

from __future__ import annotations

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.launch.prepare import prepare
from escha_deploy.launch.up import write_spec


@pytest.fixture(scope="module")
def launch():
    # no Docker client: the plan assumes the image provides the profile's needs
    return prepare("rtx5060ti-tp2-fp8", ["container.gpus=[]"], client=None, need_image=False).launch


def test_a_cache_folder_that_is_a_file(tmp_path, launch):
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    spec = cache / "escha-deploy" / "launch" / "c.json"
    with pytest.raises(BadInput) as ei:
        write_spec(launch, spec)
    assert ei.value.problems == (f"{spec}: cannot write the launch spec: Not a directory",)
    assert "XDG_CACHE_HOME" in ei.value.hint
    assert cache.read_text() == "not a folder"


@pytest.mark.parametrize("where, reason", [("/proc/escha-test/c.json", "No such file or directory"),
                                            ("/dev/full/c.json", "Not a directory")])
def test_a_folder_that_cannot_be_made_or_written(where, reason, launch):
    with pytest.raises(BadInput, match=f"^{where}: cannot write the launch spec: {reason}$"):
        write_spec(launch, __import__("pathlib").Path(where))


def test_a_full_file_system_leaves_nothing(tmp_path, launch, monkeypatch):
    """ENOSPC on write: the temporary file is removed (paths.replace_file) and the old spec
    stays. /dev/full is the kernel's own always-full device: os.replace onto it cannot be
    tested, so the write itself is sent there."""
    import os

    folder = tmp_path / "launch"
    folder.mkdir()
    spec = folder / "c.json"
    spec.write_text("old")
    real_fdopen = os.fdopen

    def full(fd, mode="r", *a, **kw):  # every write of the temporary file goes to /dev/full
        os.dup2(os.open("/dev/full", os.O_WRONLY), fd)
        return real_fdopen(fd, mode, *a, **kw)

    monkeypatch.setattr(os, "fdopen", full)
    with pytest.raises(BadInput, match="cannot write the launch spec: No space left on device"):
        write_spec(launch, spec)
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == ["c.json"] and spec.read_text() == "old"


def test_a_writable_folder_gets_the_spec(tmp_path, launch):
    spec = tmp_path / "a" / "b" / "c.json"
    write_spec(launch, spec)
    assert spec.stat().st_mode & 0o777 == 0o644 and '"plan_digest"' in spec.read_text()
