"""``paths.write_output`` / ``check_output`` / ``output_folder``: the one way every command
writes a file the user named (``compose -o``, ``plan --write-facts``, ``fleet compose --out``,
``fleet render k8s --out``, ``runtime inventory -o``, ``runtime import -o``, ``bench --chart``).
Each command's own test runs the CLI; these pin the helper's behaviour on the real file system."""

from __future__ import annotations

import os
import stat

import pytest

from escha_deploy.utils.errors import BadInput, ExitCode
from escha_deploy.utils.paths import check_output, output_folder, write_output


def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("rel, reason", [
    ("no/such/f.json", "No such file or directory"),
    ("", "Is a directory"),
    ("file/f.json", "Not a directory"),
])
def test_refusals_are_one_line_exit_2_and_create_nothing(tmp_path, rel, reason):
    (tmp_path / "file").write_text("keep\n")
    before = listing(tmp_path)
    target = tmp_path / rel if rel else tmp_path
    for call in (lambda: check_output(target, "--out-file"), lambda: write_output(target, "x", "--out-file")):
        with pytest.raises(BadInput) as info:
            call()
        assert info.value.exit_code == ExitCode.BAD_INPUT
        assert info.value.problems == (f"--out-file {target}: cannot write: {reason}",)
    assert listing(tmp_path) == before and (tmp_path / "file").read_text() == "keep\n"


def test_a_file_that_refuses_the_write_keeps_no_temporary_file():
    """/proc/version: a regular file in a folder where nothing can be created, written in place
    (the kernel answers EIO as root, EACCES otherwise); the message says so, one line."""
    before = open("/proc/version").read()
    with pytest.raises(BadInput) as info:
        write_output("/proc/version", "x", "--write-facts")
    assert info.value.problems[0].startswith("--write-facts /proc/version: cannot write: ")
    assert open("/proc/version").read() == before


def test_replaces_whole_keeping_mode_and_following_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old old old old\n")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert write_output(link, "new\n", "--output") == link
    assert link.is_symlink() and real.read_text() == "new\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert listing(tmp_path) == ["link.json", "real.json"]  # no temporary file left
    fresh = write_output(tmp_path / "b.png", b"\x89PNG", "--chart")
    umask = os.umask(0)
    os.umask(umask)
    assert fresh.read_bytes() == b"\x89PNG" and stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


def test_a_device_is_written_directly():
    assert write_output("/dev/null", "x", "--output").exists()  # not replaced by a regular file
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_output_folder_makes_one_level_only(tmp_path):
    assert output_folder(tmp_path / "out", "--out").is_dir()
    assert output_folder(tmp_path / "out", "--out").is_dir()  # an existing folder is fine
    with pytest.raises(BadInput, match=r"^--out .*/a/b: cannot write: No such file or directory$"):
        output_folder(tmp_path / "a" / "b", "--out")
    with pytest.raises(BadInput, match=r"^--out .*/a/b: cannot write: No such file or directory$"):
        output_folder(tmp_path / "a" / "b", "--out", make=False)
    (tmp_path / "f.yaml").write_text("x")
    with pytest.raises(BadInput, match=r"^--out .*/f.yaml: cannot write: Not a directory$"):
        output_folder(tmp_path / "f.yaml", "--out")
    with pytest.raises(BadInput, match=r"^--out /proc/nope: cannot write: No such file or directory$"):
        output_folder("/proc/nope", "--out")
    assert listing(tmp_path) == ["f.yaml", "out"]


def test_source_checkout_is_the_folder_with_the_dockerfile(tmp_path, monkeypatch):
    """`escha-deploy build`'s default context and compose's build context: the current folder
    when it holds the Dockerfile, else the checkout beside the package, else none (a wheel)."""
    from escha_deploy.utils import paths

    here = tmp_path / "here"
    (here / "docker").mkdir(parents=True)
    (here / "docker" / "Dockerfile").write_text("FROM scratch\n")
    pkg_parent = tmp_path / "site"
    (pkg_parent / "escha_deploy").mkdir(parents=True)
    monkeypatch.setattr(paths, "PACKAGE_DIR", pkg_parent / "escha_deploy")
    assert paths.source_checkout(here, "docker/Dockerfile") == here.resolve()
    assert paths.source_checkout(here) is None  # no Dockerfile.hicache here nor beside the package
    (pkg_parent / "Dockerfile.hicache").write_text("FROM scratch\n")
    assert paths.source_checkout(here) == pkg_parent.resolve()


def test_build_without_a_checkout_is_one_line(tmp_path, monkeypatch, cli):
    from escha_deploy.utils import paths

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paths, "PACKAGE_DIR", tmp_path / "site" / "escha_deploy")
    r = cli("build", "--hicache")
    assert r.code == 2
    assert r.err.splitlines()[0] == (f"error: no Dockerfile.hicache in {tmp_path} or beside the installed "
                                     "package: build from an escha-deploy source checkout (--context)")
    assert "Traceback" not in r.err
