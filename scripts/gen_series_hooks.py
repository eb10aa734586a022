#!/usr/bin/env python3
"""Write each runtime hook (``escha_deploy/runtime/hooks/*.py``) into the new-file section of
the series patch that carries it, byte for byte.

A patch names its hook in its header: ``Hook: sglang/<path in the package> (= <repo path>)``.
Its ``--- /dev/null`` / ``+++ b/sglang/<path>`` section is replaced by one hunk adding every line
of the repo file; the rest of the patch is left as it is. The hunks that change SGLang's own
files are written by hand and reviewed as a diff. After a hook changes, run this, then
regenerate ``runtime_patches/deltas.json`` (``escha-deploy runtime inventory --wheel W --deltas
--format json``); ``tests/runtime/test_series.py`` checks both.

    python scripts/gen_series_hooks.py           # write
    python scripts/gen_series_hooks.py --check   # exit 1 if a patch's copy is stale
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERIES = REPO / "runtime_patches"
_HOOK_RE = re.compile(r"^Hook:\s*(sglang/\S+)\s*\(=\s*(\S+)\)\s*$", re.MULTILINE)


def hook_section(package_path: str, source: bytes) -> bytes:
    """The new-file diff of ``source`` at ``b/<package_path>``: one ``@@ -0,0 +1,N @@`` hunk."""
    lines = source.splitlines(keepends=True)
    out = [b"--- /dev/null\n", f"+++ b/{package_path}\n".encode(),
           f"@@ -0,0 +1,{len(lines)} @@\n".encode()]
    for line in lines:
        out.append(b"+" + line)
    if lines and not lines[-1].endswith(b"\n"):
        out[-1] += b"\n"
        out.append(b"\\ No newline at end of file\n")
    return b"".join(out)


def regenerate(patch: bytes, root: Path = REPO) -> bytes:
    """``patch`` with the section of the hook its header names rewritten from the repo file.
    A patch with no ``Hook:`` header is returned unchanged. Raises ``ValueError`` when the
    header names a file the patch does not add."""
    text = patch.decode("utf-8")
    m = _HOOK_RE.search(text.split("\n--- ", 1)[0])
    if m is None:
        return patch
    package_path, repo_path = m.group(1), m.group(2)
    start_marker = f"--- /dev/null\n+++ b/{package_path}\n".encode()
    start = patch.find(start_marker)
    if start < 0:
        raise ValueError(f"the patch adds no {package_path} (its Hook: header names it)")
    # the section runs to the next file's '--- ' line or the end (its lines all start with '+')
    nxt = patch.find(b"\n--- ", start + len(start_marker))
    end = len(patch) if nxt < 0 else nxt + 1
    return patch[:start] + hook_section(package_path, (root / repo_path).read_bytes()) + patch[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a patch's hook copy is stale")
    args = ap.parse_args(argv)
    stale = []
    for path in sorted(SERIES.glob("[0-9][0-9][0-9][0-9]-*.patch")):
        old = path.read_bytes()
        new = regenerate(old)
        if new == old:
            continue
        stale.append(path.name)
        if not args.check:
            path.write_bytes(new)
    if args.check and stale:
        print(f"stale hook copies in {', '.join(stale)}: run scripts/gen_series_hooks.py", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
