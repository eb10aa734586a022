#!/usr/bin/env python3
"""Write what changed in the server parser between two supported SGLang releases.

What it writes: ``escha_deploy/catalog/releases/B/flags-diff.json`` for each supported release
B after the first (``index.yaml``'s order), against the release before it (A), from the two
committed flag catalogs (``flags.json``, each generated from its release's real parser by
``scripts/gen_flag_catalog.py``). Standard library only; nothing is imported from SGLang.

Per option string (``--flag``):

- ``removed``: in A's parser, not in B's (B's parser refuses it: "unrecognized arguments", or
  "ambiguous option" where it is now the prefix of longer flags, abbreviations being on);
- ``now_refused``: B keeps the option only to refuse it (sglang's ``DeprecatedAction`` with an
  error message), with that message;
- ``renamed``: B keeps the option as a deprecated alias of ``new_flag`` (a warning, it still
  works), or A's option is gone and another option of B stores the same ``dest``;
- ``added``: in B's parser, not in A's;
- ``choices``: choices added and removed; ``defaults``: the default before and after.

Usage::

    python scripts/gen_flags_diff.py            # rewrite every flags-diff.json
    python scripts/gen_flags_diff.py --check    # exit 1 naming each stale file

Exit codes: 0 written or up to date; 1 stale; 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

RELEASES = Path(__file__).resolve().parent.parent / "escha_deploy" / "catalog" / "releases"
SCHEMA = 1


def supported() -> list[str]:
    """The supported releases in ``index.yaml``'s order (its one ``supported: [...]`` line)."""
    text = (RELEASES / "index.yaml").read_text(encoding="utf-8")
    m = re.search(r"^supported:\s*\[(.*)\]", text, re.M)
    if not m:
        raise SystemExit(f"error: {RELEASES / 'index.yaml'}: no supported: [...] line")
    return [v.strip().strip('"') for v in m.group(1).split(",") if v.strip()]


def _actions(version: str) -> dict[str, dict[str, Any]]:
    raw = json.loads((RELEASES / version / "flags.json").read_text(encoding="utf-8"))
    return {opt: a for a in raw["actions"] for opt in a["flags"]}


def _working(a: dict[str, Any]) -> bool:
    return not a.get("removed")


def diff(old: str, new: str) -> dict[str, Any]:
    """The parser changes from release ``old`` to ``new`` (see the module docstring)."""
    a, b = _actions(old), _actions(new)
    b_by_dest: dict[str, list[str]] = {}
    for opt, act in b.items():
        if _working(act) and not act.get("deprecated"):
            b_by_dest.setdefault(act["dest"], []).append(opt)
    removed, now_refused, renamed, choices, defaults = [], [], [], [], []
    for opt, act in a.items():
        if not _working(act):
            continue
        if opt not in b:
            same_dest = [o for o in b_by_dest.get(act["dest"], []) if o not in a]
            if same_dest:
                renamed.append({"flag": opt, "new_flag": same_dest[0], "old_still_accepted": False})
            else:
                prefixed = sorted(o for o in b if o.startswith(opt))
                removed.append({"flag": opt, "dest": act["dest"],
                                **({"ambiguous_with": prefixed} if len(prefixed) > 1 else {})})
            continue
        nb = b[opt]
        if not _working(nb):
            now_refused.append({"flag": opt, "message": nb["removed"]})
            continue
        if nb.get("deprecated") and not act.get("deprecated"):
            renamed.append({"flag": opt, "new_flag": nb.get("new_flag"), "old_still_accepted": True})
        ca, cb = act.get("choices"), nb.get("choices")
        if ca != cb and ca is not None and cb is not None:
            gone = [c for c in ca if c not in cb]
            new_c = [c for c in cb if c not in ca]
            if gone or new_c:
                choices.append({"flag": opt, "removed": gone, "added": new_c})
        if act.get("default") != nb.get("default") and opt == act["flags"][0]:
            defaults.append({"flag": opt, "from": act.get("default"), "to": nb.get("default")})
    added = sorted({acts["flags"][0] for opt, acts in b.items()
                    if opt not in a and _working(acts) and not acts.get("deprecated")}
                   - {r["new_flag"] for r in renamed if r["new_flag"]})
    return {
        "schema": SCHEMA, "from": old, "to": new, "generator": "scripts/gen_flags_diff.py",
        "counts": {"removed": len(removed), "now_refused": len(now_refused), "renamed": len(renamed),
                   "added": len(added), "choices": len(choices), "defaults": len(defaults)},
        "removed": removed, "now_refused": now_refused, "renamed": renamed, "added": added,
        "choices": choices, "defaults": defaults,
    }


def render(d: dict[str, Any]) -> str:
    """Header keys on one line each, then one record per line (small, diffable)."""
    lines = ["{"]
    keys = list(d)
    for i, k in enumerate(keys):
        comma = "," if i < len(keys) - 1 else ""
        v = d[k]
        if isinstance(v, list) and v:
            rows = ",\n".join("    " + json.dumps(x, ensure_ascii=False) for x in v)
            lines.append(f"  {json.dumps(k)}: [\n{rows}\n  ]{comma}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed flags-diff.json is stale")
    args = ap.parse_args(argv)
    versions = supported()
    stale = 0
    for old, new in zip(versions, versions[1:]):
        d = diff(old, new)
        text, out = render(d), RELEASES / new / "flags-diff.json"
        print(f"flags {old} -> {new}: " + ", ".join(f"{v} {k}" for k, v in d["counts"].items()), file=sys.stderr)
        if args.check:
            if not out.is_file() or out.read_text(encoding="utf-8") != text:
                print(f"error: {out} is stale; rerun scripts/gen_flags_diff.py", file=sys.stderr)
                stale += 1
        else:
            out.write_text(text, encoding="utf-8")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
