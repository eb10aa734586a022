"""The lock file of a commit-built SGLang base: every file of its ``sglang`` package pinned.

An SGLang tree or image built from a commit (``0.5.19.post1.dev7+g1a2b3c4``: no stock wheel, so
no inventory committed under ``runtime_patches/base/``) is pinned by ``escha-deploy runtime
lock`` into a file the user keeps with the build context (``DEFAULT_LOCK``), and ``runtime
apply --base-lock`` (the image build's step) and ``runtime verify --base-lock`` refuse a tree
that does not match it, naming each changed, missing and extra file. The format is documented in
docs/runtime.md, "A commit-built base":

``{"schema_version": 1, "kind": "sglang-base-lock", "package": "sglang", "version": V,
"commit": C or null, "nearest_release": R, "digest": D, "file_count": N, "bytes": B,
"files": {"srt/...py": [size in bytes, "sha256 hex"], ...}}``

``digest`` is ``inventory.digest`` of ``files`` (the same digest ``runtime inventory`` prints
and a runtime description's ``base_inventory_digest`` records), so a lock and a description of
the same tree name one digest. ``nearest_release`` is ``releases.nearest_release`` of
``version``; ``nearest_findings`` says what differs from that release and what could not be
checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from escha_deploy.runtime import inventory as inv
from escha_deploy.utils.errors import BadInput, Refused

KIND = "sglang-base-lock"
SCHEMA_VERSION = 1
#: Where ``runtime lock`` writes and ``escha-deploy build`` looks, relative to the build context
#: (``Dockerfile.hicache`` copies the folder to ``/opt/escha/base/``).
DEFAULT_LOCK = "runtime_base/sglang.lock.json"
#: How many differing files a description lists by name (the count is always given).
SHOWN = 20


@dataclass(frozen=True)
class Lock:
    """A read lock file: its ``path``, the pinned ``version`` and ``commit``, the
    ``nearest_release`` it was pinned against, the inventory ``digest`` and ``files``."""

    path: Path
    version: str
    commit: str | None
    nearest_release: str
    digest: str
    files: dict[str, inv.Entry]
    parser: dict | None = None

    def check_tree(self, files: dict[str, inv.Entry], version: str | None, where: str) -> None:
        """Refuse (exit 3) a tree (``files``, SGLang ``version``, at ``where``) that is not the
        one pinned: another version, or each changed, missing and extra file, one line each
        naming the lock file and the path."""
        if version != self.version:
            raise Refused(f"{self.path}: pins SGLang {self.version}, but {where} holds {version}",
                          hint="lock that tree again (`escha-deploy runtime lock`), or use the lock made for it")
        drift = inv.compare(files, self.files)
        if not drift.ok:
            raise Refused(*[f"{self.path}: {line}" for line in drift.lines()],
                          hint=f"{where} is not the tree this lock pins; nothing was changed")


def lock_text(version: str, commit: str | None, nearest: str, files: dict[str, inv.Entry],
              parser: dict | None = None) -> tuple[str, str]:
    """The lock file's JSON (one file a line, sorted, for readable diffs) and its digest.
    ``parser``: what the tree's own parser and metric names say against the nearest release's
    (``ParserFindings`` as a dict, with the files they were written to), None when not read."""
    d = inv.digest(files)
    head = json.dumps({"schema_version": SCHEMA_VERSION, "kind": KIND, "package": inv.PACKAGE,
                       "version": version, "commit": commit, "nearest_release": nearest, "digest": d,
                       "file_count": len(files), "bytes": sum(s for s, _ in files.values()), "parser": parser})
    lines = ",\n".join(f"  {json.dumps(p)}: [{files[p][0]}, \"{files[p][1]}\"]" for p in sorted(files))
    return head[:-1] + ', "files": {\n' + lines + "\n}}\n", d


def read_lock(path: Path) -> Lock:
    """The lock at ``path``. ``BadInput`` (exit 2) naming the file and the key when it is not a
    lock file, a file name would leave the package folder, or its digest does not match its
    files (edited by hand)."""
    from escha_deploy.utils.jsonio import read_json
    from escha_deploy.utils.relpaths import confine

    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such lock file", hint="write it with `escha-deploy runtime lock`")
    data = read_json(path, "a lock file")
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise BadInput(f"{path}: kind: expected {KIND!r} (not a lock file `escha-deploy runtime lock` wrote)")
    for key in ("version", "nearest_release", "digest"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise BadInput(f"{path}: {key}: expected a string")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise BadInput(f"{path}: schema_version: expected {SCHEMA_VERSION}")
    try:
        files = {k: (int(v[0]), str(v[1])) for k, v in data["files"].items()}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise BadInput(f"{path}: files: expected {{path: [size, sha256]}} ({exc})") from None
    for rel in files:
        confine(rel, f"{path}: files", f"{inv.PACKAGE}/")
    if data["digest"] != inv.digest(files):
        raise BadInput(f"{path}: digest: does not match its files (edited by hand?)")
    commit = data.get("commit")
    parser = data.get("parser")
    if parser is not None and not isinstance(parser, dict):
        raise BadInput(f"{path}: parser: expected an object or null")
    return Lock(path, data["version"], commit if isinstance(commit, str) else None,
                data["nearest_release"], data["digest"], files, parser)


@dataclass
class NearestFindings:
    """What a commit-built tree is against its nearest release: ``differs`` (one line a file
    against that release's committed inventory, ``changed|extra|missing: sglang/P``, at most
    ``SHOWN`` named; ``differs_count`` all of them), ``traced`` (those of them that SGLang's
    pre-flight of that release runs: its late-check trace, ``startup-trace.json``), and
    ``unchecked``: what could not be checked, each once; ``parser``: how the tree's own parser and
    metric names differ from the release's (``ParserFindings.lines``; empty when the same or not
    read)."""

    differs: list[str] = field(default_factory=list)
    differs_count: int = 0
    traced: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    parser: list[str] = field(default_factory=list)


def _traced_files(release: str) -> set[str] | None:
    """The package files SGLang's pre-flight of ``release`` runs code in (its
    ``startup-trace.json`` ``functions``, ``FILE:FUNCTION``), None when the release has none."""
    from escha_deploy.sglang.releases import release_file
    from escha_deploy.utils.jsonio import read_json

    p = release_file(release, "startup-trace.json")
    if not p.is_file():
        return None
    data = read_json(p, "a startup trace")
    return {str(f).split(":", 1)[0] for f in data.get("functions", [])}


def nearest_findings(files: dict[str, inv.Entry], nearest: str, inventories: list[Path],
                     parser: dict | None = None) -> NearestFindings:
    """``NearestFindings`` of the tree ``files`` against SGLang ``nearest``: compared with the
    one of ``inventories`` (the release's committed ones, ``patching.committed_inventories``:
    ``runtime_patches[/R]/base/<tag>.json``) closest to it (the wheels of one release differ only
    in their compiled ``.so`` files), its differing files
    matched against the release's late-check trace. What cannot be compared is said in
    ``unchecked`` (no committed inventory, no trace), and always that the tree's own server
    parser and metric names were not read (the plan uses the nearest release's flag catalog and
    metric names)."""
    out = NearestFindings()
    best = None
    for p in inventories:
        drift = inv.compare(files, inv.read_inventory(p)[1])
        n = len(drift.missing) + len(drift.extra) + len(drift.changed)
        if best is None or n < best[0]:
            best = (n, drift)
    if best is None:
        out.unchecked.append(f"what differs from SGLang {nearest}: no inventory of its wheel is committed "
                             "(runtime_patches/), so the files were not compared")
    else:
        drift = best[1]
        lines = drift.lines()
        out.differs, out.differs_count = lines[:SHOWN], len(lines)
        traced = _traced_files(nearest)
        if traced is None:
            out.unchecked.append(f"SGLang {nearest} has no startup trace: the files its pre-flight runs were "
                                 "not compared")
        else:
            out.traced = [f"{inv.PACKAGE}/{p}" for p in sorted(drift.changed + drift.extra + drift.missing)
                          if p in traced]
            if out.traced:
                out.unchecked.append(f"{len(out.traced)} of the differing files hold code SGLang {nearest}'s "
                                     f"pre-flight runs ({', '.join(out.traced[:5])}"
                                     f"{', ...' if len(out.traced) > 5 else ''}): the plan's rules from them are "
                                     f"{nearest}'s, not read from this tree")
    if parser is None:
        out.unchecked.append(f"its own server parser and metric names were not read (`runtime lock --python "
                             f"SGLANG_PY` reads them): the plan checks flags with SGLang {nearest}'s flag catalog "
                             f"and reads {nearest}'s metric names")
    else:
        out.parser = ParserFindings(**{k: v for k, v in parser.items() if k in ParserFindings.__dataclass_fields__}
                                    ).lines(nearest)
        if out.parser:
            out.unchecked.append(f"the plan checks flags with SGLang {nearest}'s flag catalog and reads {nearest}'s "
                                 "metric names, not this tree's, which differ as said")
    return out


@dataclass
class ParserFindings:
    """The tree's own server parser and metric names against its nearest release's catalogs:
    ``flags`` (how many actions its parser has), ``added``/``removed`` flags (by first option
    string), ``defaults`` (``--flag: RELEASE -> TREE`` for a default that changed), and
    ``metrics_added``/``metrics_removed`` (``sglang:`` names)."""

    flags: int = 0
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    defaults: list[str] = field(default_factory=list)
    metrics_added: list[str] = field(default_factory=list)
    metrics_removed: list[str] = field(default_factory=list)

    def lines(self, nearest: str) -> list[str]:
        """What differs, one line per kind (empty: nothing)."""
        out = []
        for what, names in (("flags added", self.added), ("flags removed", self.removed),
                            ("flag defaults changed", self.defaults), ("metrics added", self.metrics_added),
                            ("metrics removed", self.metrics_removed)):
            if names:
                out.append(f"its parser against {nearest}'s: {what}: {', '.join(names[:8])}"
                           f"{', ...' if len(names) > 8 else ''}" if "flag" in what else
                           f"its metric names against {nearest}'s: {what}: {', '.join(names[:8])}"
                           f"{', ...' if len(names) > 8 else ''}")
        return out


def compare_catalogs(tree_flags: dict, release_flags: dict, tree_metrics: dict, release_metrics: dict) -> ParserFindings:
    """``ParserFindings`` of the tree's flag catalog and metric names (the releases' generators'
    formats: ``scripts/gen_flag_catalog.py``, ``scripts/gen_metric_names.py``) against a
    release's."""
    def by_flag(cat: dict) -> dict[str, dict]:
        return {a["flags"][0]: a for a in cat.get("actions", []) if a.get("flags")}

    tree, rel = by_flag(tree_flags), by_flag(release_flags)
    tm, rm = set(tree_metrics.get("metrics", {})), set(release_metrics.get("metrics", {}))
    return ParserFindings(
        flags=len(tree_flags.get("actions", [])), added=sorted(tree.keys() - rel.keys()),
        removed=sorted(rel.keys() - tree.keys()),
        defaults=[f"{f}: {rel[f].get('default')!r} -> {tree[f].get('default')!r}" for f in sorted(tree.keys() & rel.keys())
                  if tree[f].get("default") != rel[f].get("default")],
        metrics_added=sorted(tm - rm), metrics_removed=sorted(rm - tm))


def side_files(lock: Path) -> tuple[Path, Path]:
    """Where ``runtime lock --python`` writes the tree's flag catalog and metric names: beside the
    lock, named after it (``sglang.lock.json`` -> ``sglang.flags.json``, ``sglang.metrics.json``)."""
    stem = lock.name.removesuffix(".json").removesuffix(".lock")
    return lock.with_name(f"{stem}.flags.json"), lock.with_name(f"{stem}.metrics.json")


def read_parser(python: str, package_dir: Path, version: str, nearest: str, scripts: Path,
                flags_out: Path, metrics_out: Path, timeout_s: float = 600) -> ParserFindings:
    """Run the releases' generators (``scripts/gen_flag_catalog.py``, ``scripts/gen_metric_names.py``
    of the checkout ``scripts``) in SGLang's interpreter ``python``, which imports the tree at
    ``package_dir``, writing ``flags_out`` and ``metrics_out``; compare them with ``nearest``'s.
    ``Refused`` (exit 3), one line naming the interpreter and the tree, when its SGLang cannot be
    imported to read its parser (the generator's last error line quoted)."""
    import subprocess

    from escha_deploy.sglang.releases import release_file
    from escha_deploy.utils.jsonio import read_json
    from escha_deploy.utils.termtext import printable

    for cmd in ([python, str(scripts / "gen_flag_catalog.py"), "--out", str(flags_out)],
                [python, str(scripts / "gen_metric_names.py"), "--tree", str(package_dir), "--version", version,
                 "--out", str(metrics_out)]):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Refused(f"{python}: cannot run it to read the parser of SGLang {version} at {package_dir} "
                          f"({exc})") from None
        if proc.returncode != 0:
            last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), f"exit {proc.returncode}")
            raise Refused(f"{python}: SGLang {version} at {package_dir} cannot be imported to read its parser: "
                          f"{printable(last.strip())[:300]}",
                          hint="use the interpreter that runs that SGLang (--python), with its dependencies installed")
    tree_flags = read_json(flags_out, "a flag catalog")
    tree_metrics = read_json(metrics_out, "a metric-name catalog")
    rel_flags = release_file(nearest, "flags.json")
    rel_metrics = release_file(nearest, "metrics.json")
    return compare_catalogs(tree_flags, read_json(rel_flags, "a flag catalog"), tree_metrics,  # type: ignore[arg-type]
                            read_json(rel_metrics, "a metric-name catalog") if rel_metrics.is_file() else {})  # type: ignore[arg-type]
