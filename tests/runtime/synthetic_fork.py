"""A synthetic fork of SGLang 0.5.19, made with real git from the real wheel's files.

The repository is laid out like github.com/sgl-project/sglang: the package under
``python/sglang/``, plus ``python/pyproject.toml``, ``sgl-kernel/`` and ``tools/``. Its first
commit (tagged ``v0.5.19``) holds clean 0.5.19 package files from the wheel (``BASE_DIRS``); the branch
``escha`` then carries commits shaped like the fork's (stand-ins for its content, small but
real diffs of real files):

====  ============================================================  ============================
key   commit                                                        what the import must do
====  ============================================================  ============================
int2  adds an INT2 KV module and W2 layers, edits memory_pool.py     declared int2-kv, w2-weights
jp    non-ASCII subject (Japanese, RFC 2047 + folded), non-ASCII     subject intact
      author; a comment in pool_host/mha.py
rsv   the fork's own host reserve: pool_host/base.py at the line     overlaps our 0001
      our 0001 changes
tools adds tools/x.py only                                          listed and left out
ren   renames pool_host/mla.py                                      refused
kern  edits sgl-kernel/csrc/x.cu                                    refused
====  ============================================================  ============================

``make_fork(wheel, out)`` writes ``out/repo`` and exports ``git format-patch`` twice:
``out/all`` (v0.5.19..escha, every commit) and ``out/good`` (v0.5.19..escha~2: without the
rename and sgl-kernel commits, what the fork's owner would export after dropping them).
Author and committer dates are fixed, so the hashes are the same on every run.

Run as a script (``.ci/test`` does): ``python tests/runtime/synthetic_fork.py WHEEL OUT``;
prints the commit hashes as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

#: The package folders the base commit holds: every file the commits touch lives here. The whole
#: package (4,371 files, 85 MB) took 24 s to unpack and `git add` on the 2-core CI machine under
#: load; these two folders (305 files, 7.7 MB) are what `git format-patch` needs.
BASE_DIRS = ("sglang/srt/mem_cache/", "sglang/srt/layers/quantization/")
SUBJECT_JP = ("hicache: INT2デバイスプール用のホストKVプール — コードとスケール/ゼロを"
              "別々のテンソルに保持する")
AUTHOR_JP = "中野 建設"


def _git(repo: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{path}: {old!r} not found (not the 0.5.19 file?)"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


_GOOD_DIFF_GIT = b"diff --git a/python/sglang/x.py b/python/sglang/x.py"


def hand_made_mail(diff_git: bytes = _GOOD_DIFF_GIT, plus: bytes = b"+++ b/python/sglang/x.py",
         hunk: bytes = b"@@ -0,0 +1 @@") -> bytes:
    """A ``git format-patch`` mail adding one file, made by hand for paths git would not commit
    (``..``, ``//``, NUL, bytes that are not UTF-8): ``diff --git`` is on line 7, ``+++`` on 11
    and the hunk header on 12."""
    return (b"From " + b"a" * 40 + b" Mon Sep 17 00:00:00 2001\nFrom: A <a@example.org>\n"
            b"Date: Mon, 1 Dec 2026 10:00:00 +0000\nSubject: [PATCH] x\n\n---\n"
            + diff_git + b"\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n"
            + plus + b"\n" + hunk + b"\n+x = 1\n-- \n2.40.0\n")



def make_fork(wheel: Path, out: Path) -> dict[str, str]:
    """Build the repository and the two exports under ``out``; return ``{key: commit hash}``."""
    out = Path(out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    repo = out / "repo"
    (repo / "python").mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.filename.startswith(BASE_DIRS) and not info.is_dir():
                z.extract(info, repo / "python")
    (repo / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.19"\n')
    (repo / "sgl-kernel" / "csrc").mkdir(parents=True)
    (repo / "sgl-kernel" / "csrc" / "x.cu").write_text("// sgl-kernel source\n")
    env = dict(os.environ, GIT_AUTHOR_NAME="SGLang", GIT_AUTHOR_EMAIL="sglang@example.com",
               GIT_COMMITTER_NAME="SGLang", GIT_COMMITTER_EMAIL="sglang@example.com",
               GIT_AUTHOR_DATE="2026-03-01T00:00:00+00:00",
               GIT_COMMITTER_DATE="2026-03-01T00:00:00+00:00")
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(k, None)
    _git(repo, "init", "-q", "-b", "main", env=env)
    _git(repo, "config", "core.autocrlf", "false", env=env)
    _git(repo, "add", "-A", env=env)
    _git(repo, "commit", "-q", "-m", "v0.5.19: the clean package files of the wheel", env=env)
    _git(repo, "tag", "v0.5.19", env=env)
    _git(repo, "checkout", "-q", "-b", "escha", env=env)
    hashes: dict[str, str] = {}
    pkg = repo / "python" / "sglang"

    def commit(key: str, message: str, author: str = "Nakano Kensetsu <nakano@example.com>",
               day: int = 2) -> None:
        e = dict(env, GIT_AUTHOR_DATE=f"2026-03-{day:02d}T09:00:00+09:00",
                 GIT_COMMITTER_DATE=f"2026-03-{day:02d}T09:00:00+09:00")
        _git(repo, "add", "-A", env=e)
        _git(repo, "commit", "-q", "--author", author, "-m", message, env=e)
        hashes[key] = _git(repo, "rev-parse", "HEAD", env=e).strip()

    # int2: new modules and an edit of a file our series does not touch
    (pkg / "srt" / "mem_cache" / "int2_kv.py").write_text(
        '"""OSCAR INT2 KV cache (stand-in): 2-bit codes plus per-group scales/zeros."""\n\n'
        "INT2_BITS = 2\n\n\ndef packed_bytes(head_dim: int) -> int:\n"
        "    return head_dim * INT2_BITS // 8\n")
    (pkg / "srt" / "layers" / "quantization" / "escha_w2.py").write_text(
        '"""Escha-W2 2-bit weight layers (stand-in)."""\n\nW2_GROUP = 128\n')
    _edit(pkg / "srt" / "mem_cache" / "memory_pool.py", "\nclass ", 
          "\n# escha: the INT2 KV pool lives in int2_kv.py\n\n\nclass ")
    commit("int2", "escha: OSCAR INT2 KV cache\n\nThe 2-bit KV cache (from sgl-project#32129) and "
           "the Escha-W2 quantization layers.", day=2)

    # jp: a non-ASCII subject long enough that git folds it, a non-ASCII author
    _edit(pkg / "srt" / "mem_cache" / "pool_host" / "mha.py", "\nclass ",
          "\n# escha: INT2プールのホスト側はコードとスケール/ゼロの2テンソル\n\n\nclass ")
    commit("jp", SUBJECT_JP + "\n\n本文: ホストプールは1テンソルを前提としている。",
           author=f"{AUTHOR_JP} <nakano@example.com>", day=3)

    # rsv: the fork's own configurable reserve, at the line our 0001 changes
    _edit(pkg / "srt" / "mem_cache" / "pool_host" / "base.py",
          "HICACHE_HOST_MEMORY_RESERVE_BYTES: int = 10 * (1024**3)",
          "HICACHE_HOST_MEMORY_RESERVE_BYTES: int = int(\n"
          "    __import__(\"os\").environ.get(\"SGLANG_HICACHE_HOST_RESERVE_BYTES\", 10 * (1024**3))\n)")
    commit("rsv", "hicache: read host memory once per TP group\n\nBackport of sgl-project#38157 "
           "plus a configurable reserve.", day=4)

    # tools: outside python/sglang only
    (repo / "tools").mkdir()
    (repo / "tools" / "x.py").write_text('"""mamba transfer repro (stand-in)."""\n')
    commit("tools", "tools: mamba transfer repro", day=5)

    # ren: a rename (refused)
    _git(repo, "mv", "python/sglang/srt/mem_cache/pool_host/mla.py",
         "python/sglang/srt/mem_cache/pool_host/mla_pool.py", env=env)
    commit("ren", "hicache: rename the MLA host pool module", day=6)

    # kern: sgl-kernel (refused)
    (repo / "sgl-kernel" / "csrc" / "x.cu").write_text("// sgl-kernel source, INT2 kernels\n")
    commit("kern", "sgl-kernel: INT2 dequant kernels", day=7)

    for name, rng in (("all", "v0.5.19..escha"), ("good", "v0.5.19..escha~2")):
        _git(repo, "format-patch", "-q", "-o", str(out / name), rng, env=env)
    return hashes


OURS_0001 = "0001-hicache-host-reserve.patch"


def declaration(hashes: dict[str, str], decision: str | None = "drop-fork",
                caps: str | None = "[int2-kv, w2-weights]") -> str:
    """An ``escha-fork.yaml`` for the ``good`` export: ``caps`` declared for the INT2 commit
    (``None``: nothing declared), ``decision`` for our 0001 against the fork's reserve commit
    (``None``: no decision)."""
    lines = ["# what each commit provides (names from escha_deploy/sglang/capabilities.py)"]
    lines += ["commits:", f"  {hashes['int2'][:10]}: {caps}"] if caps else ["commits: {}"]
    if decision:
        lines += ["overlaps:", f"  - ours: {OURS_0001}", f"    fork: {hashes['rsv'][:8]}",
                  f"    decision: {decision}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--declare", choices=("drop-fork", "drop-ours", "undeclared"),
                    help="also write out/good/escha-fork.yaml: our 0001 kept (drop-fork), "
                    "the fork's reserve commit kept (drop-ours), or drop-fork with no "
                    "capabilities declared (undeclared)")
    a = ap.parse_args()
    h = make_fork(a.wheel, a.out)
    if a.declare:
        text = (declaration(h, "drop-fork", None) if a.declare == "undeclared"
                else declaration(h, a.declare))
        (a.out / "good" / "escha-fork.yaml").write_text(text, encoding="utf-8")
    print(json.dumps(h, indent=2))
