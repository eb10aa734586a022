"""Loading a profile: YAML with positions, ``extends:``, ``--set``, one validation.

Loading is a staged pipeline:

1. read the YAML with source positions (``yamlpos``);
2. resolve ``extends:`` by deep-merging raw mappings, parent first, child over parent, each key
   keeping the file:line it came from;
3. apply ``--set KEY=VALUE`` overrides (dotted path; the value is read as YAML);
4. validate the merged mapping once; every error becomes one line
   ``file:line: dotted.key: message``, all of them, sorted by line;
5. run the profile's rules (``profile.rules.RULES``), each problem placed where the user set a
   key it depends on.

``load_profile()`` is the only way in and the only place that catches pydantic's
``ValidationError`` for profiles. Callers never see pydantic's error type.
"""

from __future__ import annotations

import copy
import errno
import os
from pathlib import Path
from typing import Sequence

from pydantic import ValidationError

from ..utils.errors import BadInput, Refused
from ..utils.yamlpos import Positions, format_validation_errors, load_yaml_with_positions, parse_yaml_text, position_of
from .models import FLAT_L3_KEYS, NAME_RULE, Profile
from .rules import RULES, warnings_of


def _profiles_dir() -> Path:
    from ..utils.paths import profiles_dir

    return profiles_dir()


def list_profiles() -> list[str]:
    """Names of the shipped profiles (``profiles/*.yaml`` stems), sorted."""
    return sorted(p.stem for p in _profiles_dir().glob("*.yaml"))


#: Suffixes that make a profile reference a file path (JSON is read as the YAML it is).
PROFILE_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def names_a_file(ref: str, relative_to: Path | None = None) -> bool:
    """Whether ``ref`` is read as a file rather than a shipped profile name: it ends with
    ``.yaml``, ``.yml`` or ``.json``, holds a path separator, or is an existing file whose
    name is not a shipped profile's (a shipped name wins over a file of the same name in the
    current folder: ``./NAME`` reads the file)."""
    from ..utils.jsonio import file_problem

    if ref.endswith(PROFILE_FILE_SUFFIXES) or "/" in ref or os.sep in ref:
        return True
    if file_problem(_profiles_dir() / f"{ref}.yaml") is None:
        return False
    return file_problem((relative_to / ref) if relative_to is not None else Path(ref)) is None


def profile_name(ref: str | None, overrides: Sequence[str] = ()) -> str | None:
    """The name a profile reference's containers are labelled with (``io.escha.profile``): a
    shipped profile's name as given, a file's (``names_a_file``, the rule ``--profile`` reads
    by: ``.yaml``, ``.yml``, ``.json`` or a path) the name it loads with; ``None`` stays ``None``
    (every profile)."""
    if ref is None or (not overrides and not names_a_file(ref)):
        return ref
    return load_profile(ref, overrides).name


def resolve_profile_path(ref: str, relative_to: Path | None = None) -> Path:
    """A profile name (``rtx5060ti-tp2``) or a path to a YAML/JSON file -> the file's path.

    ``names_a_file`` decides which; a relative path is taken from ``relative_to`` (the folder
    of the file that ``extends:`` it) or the current folder. A path without one of
    ``PROFILE_FILE_SUFFIXES`` that names no file is tried with each of them in turn
    (``./good`` reads ``./good.yaml``). Raises ``BadInput`` listing the known profiles when
    neither exists; a missing file is named as typed (``./good``, not ``good``).
    """
    from ..utils.jsonio import file_problem

    is_file = names_a_file(ref, relative_to)
    shown = ref
    if is_file:
        if relative_to is not None and not os.path.isabs(ref):
            shown = str(relative_to / ref)  # beside the file that extends it
        c = Path(shown)
        if not ref.endswith(PROFILE_FILE_SUFFIXES) and file_problem(c) == os.strerror(errno.ENOENT):
            for suffix in PROFILE_FILE_SUFFIXES:
                if file_problem(Path(shown + suffix)) is None:
                    return Path(shown + suffix)
    else:
        c = _profiles_dir() / f"{ref}.yaml"

    problem = file_problem(c)
    if problem is None:
        return c
    for d in (c, Path(ref)):
        if file_problem(d) == "a folder, not a regular file":
            found = sorted(p.name for p in d.glob("*.y*ml"))[:5]
            raise BadInput(f"{d}: is a directory, not a profile file",
                           hint=f"pass one of its YAML files: {', '.join(found)}" if found else
                           "pass a profile name or a profile YAML file")
    if is_file:
        # a FIFO, a device (/dev/stdin as a pipe, /dev/zero) or an unreadable file: say which
        if problem != os.strerror(errno.ENOENT):
            raise BadInput(f"{shown}: cannot read the profile: {problem}")
        tried = "" if ref.endswith(PROFILE_FILE_SUFFIXES) else " (nor " + ", ".join(
            shown + s for s in PROFILE_FILE_SUFFIXES) + ")"
        raise BadInput(f"{shown}: no such profile file{tried}")
    known = ", ".join(list_profiles()) or "(none)"
    raise BadInput(f"unknown profile {ref!r}: known profiles are {known}",
                   hint="or pass a path to a profile YAML file")


def shipped_profile_file(ref: str) -> Path | None:
    """The shipped file a profile reference reads (``rtx5060ti-tp2`` -> the ``profiles/``
    folder's ``rtx5060ti-tp2.yaml``, in site-packages for an installed escha-deploy), or ``None``
    for a reference that reads a file of the user's (``names_a_file``) or names no profile."""
    from ..utils.jsonio import file_problem

    if names_a_file(ref):
        return None
    path = _profiles_dir() / f"{ref}.yaml"
    return path if file_problem(path) is None else None


#: The first line of a shipped profile: the schema for editors (yaml-language-server), relative
#: to the shipped folder; a copy elsewhere names the installed schema by its absolute path.
_SCHEMA_LINE = "# yaml-language-server: $schema="


def copy_profile(name: str, dest: str | None = None, *, force: bool = False) -> Path:
    """Write an editable copy of the shipped profile ``name`` to ``dest`` (default
    ``./NAME.yaml``; a folder gets ``NAME.yaml`` inside it) and return its path. The text is
    the shipped file's, comments and line numbers kept, with its editor-schema line pointing at
    the installed schema, so the copy loads and plans as the shipped profile does. Refuses
    (``BadInput``, nothing written) a name that is not a shipped profile, a destination that is
    not ``.yaml``/``.yml``, and an existing file unless ``force``."""
    from ..utils.paths import catalog_dir, write_output

    source = shipped_profile_file(name) if "/" not in name and os.sep not in name else None
    if source is None:
        known = ", ".join(list_profiles()) or "(none)"
        raise BadInput(f"profiles copy: {name!r} is not a shipped profile: known profiles are {known}")
    target = Path(dest) if dest else Path(f"{name}.yaml")
    if os.path.isdir(target):
        target = target / f"{name}.yaml"
    if target.suffix not in (".yaml", ".yml"):
        raise BadInput(f"{target}: a profile copy is a YAML file: name it {target.name}.yaml")
    if os.path.lexists(target) and not force:
        raise BadInput(f"{target}: exists; pass another DEST, or --force to replace it")
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    if lines and lines[0].startswith(_SCHEMA_LINE):
        lines[0] = f"{_SCHEMA_LINE}{catalog_dir().resolve() / 'profile.schema.json'}\n"
    write_output(target, "".join(lines), "profiles copy")
    return target


#: The YAML values with nothing below them (``deep_merge`` moves only the key's own position).
_SCALARS = (str, int, float, type(None))


def deep_merge(base: dict, over: dict, base_pos: Positions, over_pos: Positions, path: tuple) -> None:
    """Merge the raw mapping ``over`` into ``base`` (in place, child over parent), moving the
    positions of each replaced key from ``over_pos`` into ``base_pos``."""
    for key, value in over.items():
        kp = path + (key,)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_merge(base[key], value, base_pos, over_pos, kp)
        elif key in base and isinstance(base[key], _SCALARS) and isinstance(value, _SCALARS):
            # a scalar over a scalar: no position below either key, only the key's own moves (the
            # positions of a profile and its parent are some 300 keys; scanning them for each of a
            # file's keys was most of a load)
            base[key] = value
            base_pos.pop(kp, None)
            if kp in over_pos:
                base_pos[kp] = over_pos[kp]
        else:
            base[key] = copy.deepcopy(value)
            for p in [p for p in base_pos if p[: len(kp)] == kp]:
                del base_pos[p]
            for p, v in over_pos.items():
                if p[: len(kp)] == kp:
                    base_pos[p] = v
    if path in over_pos:
        base_pos.setdefault(path, over_pos[path])


#: The longest ``extends:`` chain read (a shipped profile extends one; each file is a Python
#: stack frame of ``load_raw``, and 1,200 of them were a RecursionError).
MAX_EXTENDS = 64


def load_raw(path: Path, seen: tuple[Path, ...] = (), chain: list[str] | None = None) -> tuple[dict, Positions]:
    """Load one file and, recursively, what it extends; return the merged raw mapping.
    ``chain``: when given, the files read are appended to it, the root parent first and this
    file last (the order in which each overrides the one before)."""
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(str(p) for p in seen + (path,))
        raise BadInput(f"{path}: extends itself: {chain}")
    if len(seen) >= MAX_EXTENDS:
        raise BadInput(f"{seen[0]}: extends: a chain of more than {MAX_EXTENDS} profiles "
                       f"({seen[0].name} -> {seen[1].name} -> ... -> {path.name}); a profile extends a few at most")
    data, pos = load_yaml_with_positions(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInput(f"{path}:1: a profile is a mapping of keys, not {type(data).__name__}")
    parent_ref = data.pop("extends", None)
    if parent_ref is None:
        if chain is not None:
            chain.append(str(path))
        return data, pos
    if not isinstance(parent_ref, str):
        line = pos.get(("extends",), (str(path), 1))[1]
        raise BadInput(f"{path}:{line}: extends: must be a profile name or path")
    try:
        parent_path = resolve_profile_path(parent_ref, relative_to=path.parent)
    except BadInput as exc:
        line = pos.get(("extends",), (str(path), 1))[1]
        raise BadInput(f"{path}:{line}: extends: {exc.message}", hint=exc.hint) from None
    merged, merged_pos = load_raw(parent_path, seen + (path,), chain)
    if chain is not None:
        chain.append(str(path))
    # The child's own name/description never come from the parent.
    merged.pop("name", None)
    merged.pop("description", None)
    deep_merge(merged, data, merged_pos, pos, ())
    return merged, merged_pos


def apply_override(data: dict, pos: Positions, item: str) -> None:
    """Apply one ``--set KEY=VALUE`` to the raw mapping ``data`` (the value read as YAML), and
    record in ``pos`` that ``KEY`` was set by ``--set KEY`` (line 0)."""
    if "=" not in item:
        raise BadInput(f"--set {item}: expected KEY=VALUE (e.g. hicache.hicache_ratio=1.5)")
    key, _, raw = item.partition("=")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:  # bytes that are not UTF-8 (surrogateescape)
        raise BadInput(f"--set {key.encode('utf-8', 'backslashreplace').decode()}: the key is not UTF-8 text "
                       f"(offset {exc.start}); keys are ASCII names such as hicache.hicache_ratio") from None
    keys = tuple(k for k in key.strip().split(".") if k)
    if not keys:
        raise BadInput(f"--set {item}: empty key")
    value, _ = parse_yaml_text(raw, f"--set {key}") if raw.strip() else (None, {})
    where = (f"--set {'.'.join(keys)}", 0)
    node = data
    for depth, k in enumerate(keys[:-1], start=1):
        child = node.get(k)
        if child is None:
            child = node[k] = {}
            # a section this override created is the override's, not the file's: an unknown
            # one (``--set server.tp_size=4``) is reported at the --set, not at the file's top
            pos[keys[:depth]] = where
        if not isinstance(child, dict):
            raise BadInput(f"--set {item}: {'.'.join(keys[:-1])} is not a mapping")
        node = child
    node[keys[-1]] = value
    for p in [p for p in pos if p[: len(keys)] == keys]:
        del pos[p]
    pos[keys] = where


def load_profile(ref: str, overrides: Sequence[str] = (), warnings: list[str] | None = None,
                 positions: Positions | None = None) -> Profile:
    """Load a profile by name or path, resolve ``extends:``, apply ``--set`` overrides,
    validate once.

    Raises ``BadInput`` (exit 2) with one line per problem, each naming file:line and the
    dotted key, for malformed YAML, unknown keys, bad units, bare numbers for sizes, values out
    of range, unknown profiles (listing the known ones) and the problems of ``profile.rules``;
    raises ``Refused`` (exit 3) for what SGLang refuses after it starts (the rules of kind
    ``refusal``). ``warnings``: when given, one ``file:line: key: message`` line is appended
    per warning rule's item (keys that
    load but do nothing). ``positions``: when given, filled with where each key was set: key
    path -> ``(file, line)``, or ``("--set a.b", 0)`` for an override (``key_source`` words it).
    """
    path = resolve_profile_path(ref)
    chain: list[str] = []
    data, pos = load_raw(path, (), chain)
    if "name" not in data:
        # no `name:` in the file (nor in what it extends: a parent's name is never inherited):
        # the file's stem, and a problem with it is this file's, not the parent's
        data["name"] = path.stem
        pos[("name",)] = (str(path.resolve()), 0)
    stem_position = pos.get(("name",))
    for item in overrides:
        apply_override(data, pos, item)
    _flat_l3_positions(data, pos)
    _anchor_relative_dirs(data, pos)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        from_file = pos.get(("name",)) == stem_position and stem_position == (str(path.resolve()), 0)
        raise BadInput(*[t for _, t in format_validation_errors(
            exc, pos, str(path), Profile, reword=lambda loc, err: _name_message(loc, err, from_file))]) from None
    errors = [r for r in RULES if r.kind == "error"]
    problems = [_blame(pos, chain, overrides, p.loc, p.message, p.deps, str(path)) for r in errors for p in r.check(profile)]
    if problems:
        raise BadInput(*[t for _, _, t in sorted(problems)])
    refusals = [_placed(pos, p.loc, p.message, str(path))
                for r in RULES if r.kind == "refusal" for p in r.check(profile)]
    if refusals:  # SGLang accepts the arguments and stops later: a refusal before start, exit 3
        raise Refused(*[t for _, _, t in sorted(refusals)])
    if positions is not None:
        positions.update(pos)
    if warnings is not None:
        warnings += [_placed(pos, loc, msg, str(path))[2] for loc, msg in warnings_of(profile)]
    return profile


#: Keys naming a folder the server writes in: a relative one is taken from the folder of the
#: profile file that sets it (the current folder for a ``--set``), wherever the profile is read
#: from (``plan`` here, ``compose`` in another folder, the container).
RELATIVE_TO_FILE: tuple[tuple[str, ...], ...] = (("hicache", "storage_dir"), ("hicache", "l3", "dir"))


def _anchor_relative_dirs(data: dict, pos: Positions) -> None:
    """Make each ``RELATIVE_TO_FILE`` value that is a relative path absolute, against the folder
    of the file whose line set it (``pos``), or the current folder for a ``--set``; ``~`` is left
    to the reader that expands it."""
    for loc in RELATIVE_TO_FILE:
        node = data
        for k in loc[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        value = node.get(loc[-1]) if isinstance(node, dict) else None
        if not isinstance(value, str) or not value.strip() or value.startswith(("/", "~")):
            continue
        file = (pos.get(loc) or ("", 0))[0]
        base = Path.cwd() if not file or file.startswith("--set ") else Path(file).parent
        node[loc[-1]] = os.path.abspath(base / value)


def _flat_l3_positions(data: dict, pos: Positions) -> None:
    """Where each flat L3 key was set is where its ``hicache.l3`` key was set
    (``models.l3_from_flat`` reads the values the same way), so a problem with ``l3.dir`` is
    placed at the ``storage_dir`` line or ``--set`` that gave it."""
    hc = data.get("hicache")
    if not isinstance(hc, dict):
        return
    for flat, key in FLAT_L3_KEYS.items():
        where = pos.get(("hicache", flat))
        if flat in hc and where is not None:
            pos[("hicache", "l3", key)] = where
            if key == "kind":
                pos[("hicache", "l3")] = where


def _name_message(loc: tuple, err: dict, from_file: bool) -> str | None:
    """A bad profile name in words (the regex is no help to a reader): the rule, and where the
    name came from (``from_file``: the file's stem, the file has no ``name:``)."""
    if loc != ("name",) or err["type"] != "string_pattern_mismatch":
        return None
    return (f"the profile name comes from the file name {err['input']!r}; {NAME_RULE}: add `name:`"
            if from_file else f"{err['input']!r} is not a profile name: {NAME_RULE}")


def _placed(pos: Positions, loc: tuple[str, ...], msg: str, origin: str) -> tuple[str, int, str]:
    """``(file, line, text)`` of a problem at ``loc``'s own position (or its nearest ancestor's):
    ``file:line: key: msg``, or ``--set a.b: msg`` for an override."""
    file, line = position_of(pos, loc) or (origin, 0)
    where = f"{file}:{line}" if line else file
    key = "" if file == f"--set {'.'.join(loc)}" else f"{'.'.join(loc)}: "  # "--set a.b: msg"
    return (file, line, f"{where}: {key}{msg}")


def key_source(positions: Positions, loc: tuple[str, ...]) -> str | None:
    """Where the key ``loc`` itself was set, in words: ``file:line`` (the file that set it: a
    child profile's line, not its parent's, when the child overrides it) or ``--set a.b``;
    ``None`` when no file nor override set it (the model's default)."""
    where = positions.get(tuple(loc))
    if where is None:
        return None
    file, line = where
    return f"{file}:{line}" if line else file


def _blame(pos: Positions, chain: list[str], overrides: Sequence[str], loc: tuple, msg: str,
           deps: tuple[tuple, ...], origin: str) -> tuple[str, int, str]:
    """One cross-field problem as ``(file, line, text)``, placed where the user set a key it
    depends on (``loc`` itself or one of ``deps``): a ``--set`` first (``--set a.b=v: loc: msg``;
    ``--set loc: msg`` for ``loc``'s own), else the line of the most-derived profile file that
    set one (a child's line, not its parent's), ``loc`` first within a file; else ``loc``'s
    nearest ancestor (``yamlpos.position_of``)."""
    dotted = ".".join(loc)
    keys = [tuple(k) for k in (loc, *deps) if tuple(k) in pos]
    sets = [k for k in keys if pos[k][0].startswith("--set ")]
    if sets:
        k = sets[0]
        if k == tuple(loc):
            return (pos[k][0], 0, f"{pos[k][0]}: {msg}")
        key = pos[k][0].removeprefix("--set ")  # the key the --set named (a flat L3 key for its l3 key)
        item = next((o.strip() for o in reversed(overrides)
                     if ".".join(p for p in o.partition("=")[0].strip().split(".") if p) == key), key)
        return (f"--set {key}", 0, f"--set {item}: {dotted}: {msg}")
    if keys:
        rank = {f: i for i, f in enumerate(chain)}
        k = max(keys, key=lambda k: rank.get(pos[k][0], -1))  # max keeps the first of equals: loc
        file, line = pos[k]
    else:
        file, line = position_of(pos, loc) or (origin, 0)
    where = f"{file}:{line}" if line else file
    return (file, line, f"{where}: {dotted}: {msg}")
