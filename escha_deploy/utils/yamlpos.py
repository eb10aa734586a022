"""YAML with source positions, so every profile error can name file:line; parsed safely.

``load_yaml_with_positions(path)`` returns the plain data and a map from key path (a tuple of
keys and list indexes) to ``(file, line)``. Missing keys are looked up at their nearest ancestor
(the pattern of Dagster's ``source_position.py``).

One parse per file: libyaml (PyYAML's ``CSafeLoader``) composes the node graph once, which
carries the marks; the data is constructed from that same graph by PyYAML's safe constructor.
Before anything is constructed the graph is checked, because a profile is user input:

- **aliases** cannot expand without bound: the node count after alias expansion is capped at
  ``MAX_NODES`` (a 4 KB file of nine levels of nine aliases expands to 9**9 nodes, the
  "billion laughs" of XML), nesting at ``MAX_DEPTH``, and a recursive alias is refused;
- **duplicate keys** are an error naming both lines (YAML 1.2 section 3.2.1.3 says keys are
  unique; PyYAML keeps the last one silently);
- a file that is **not UTF-8** is one line with the byte offset (YAML 1.2 section 5.2 allows
  UTF-16/32 with a BOM, profiles do not need them);
- a file larger than ``MAX_FILE_BYTES`` is refused before it is read in full.
"""

from __future__ import annotations

import copy
import functools
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from escha_deploy.utils.errors import BadInput

Positions = dict[tuple, tuple[str, int]]

#: Largest profile file read, in bytes. The shipped profiles are 1.7-4.6 KB; a commented
#: reference profile with every field stays far below this.
MAX_FILE_BYTES = 256 * 1024
#: Largest node count after alias expansion. A full profile is about 200 nodes.
MAX_NODES = 20_000
#: Deepest nesting of mappings and lists. A profile is 4 levels deep (runtime.kv_cache.int2.x).
MAX_DEPTH = 32

_BaseLoader = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


class _Loader(_BaseLoader):  # type: ignore[misc,valid-type]
    """PyYAML's safe loader, reading ``2e9`` and ``1.5e3`` (an exponent without a dot, or without
    its sign) as the numbers they are, as YAML 1.2's core schema does; YAML 1.1 (PyYAML) reads
    them as strings, which a numeric key would refuse as text."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
                              list("-+.0123456789"))


class _Problems(Exception):
    """Internal: the lines of one file's structural problems."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines[0])
        self.lines = lines


def _check_graph(root: yaml.Node, file: str) -> None:
    """Bound the expanded size and depth of the node graph; refuse recursive aliases.

    Memoised per node object (an alias is the same object reached twice), so the check itself
    is linear in the number of distinct nodes whatever the aliases multiply to.
    """
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    aliased = [False]

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            aliased[0] = True  # reached twice: an alias
            return sizes[key]
        if key in open_:
            raise _Problems([f"{file}:{node.start_mark.line + 1}: a YAML alias refers to its own anchor"])
        if depth > MAX_DEPTH:
            raise _Problems([f"{file}:{node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels"])
        total = 1
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            open_.add(key)
            children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                        else node.value)
            for child in children:
                total += size(child, depth + 1)
                if total > MAX_NODES:
                    raise _Problems([
                        f"{file}:{node.start_mark.line + 1}: YAML aliases expand to more than {MAX_NODES} "
                        "nodes (a profile or fleet file has a few hundred); write the values out instead"
                        if aliased[0] else
                        f"{file}:{node.start_mark.line + 1}: more than {MAX_NODES} keys and values (a profile "
                        "or fleet file has a few hundred)"])
            open_.discard(key)
        sizes[key] = total
        return total

    size(root, 0)


#: The number spellings read as they look: decimal integers without a leading zero, decimal
#: fractions with an optional exponent, and YAML's ``.inf``/``.nan`` (which the models refuse
#: by name). PyYAML follows YAML 1.1, where ``0b1010`` is 10, ``012`` is octal 10, ``0x1f`` is
#: 31, ``1:30`` is sexagesimal 90 and ``1_000`` is 1000 (yaml.org/type/int.html,
#: yaml.org/type/float.html); YAML 1.2's core schema dropped all but hex and ``0o`` octal.
_PLAIN_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$")
_PLAIN_FLOAT = re.compile(r"^[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_NUMBER_TAGS = {"tag:yaml.org,2002:int": _PLAIN_INT, "tag:yaml.org,2002:float": _PLAIN_FLOAT}


def _yaml11_number_kind(text: str) -> str:
    """What YAML 1.1 made of a number spelling that ``_PLAIN_INT``/``_PLAIN_FLOAT`` refuse."""
    t = text.lstrip("+-")
    if "_" in t:
        return "a number written with '_' separators"
    if ":" in t:
        return "a base-60 (sexagesimal) number"
    if t[:2] in ("0b", "0B"):
        return "a binary number"
    if t[:2] in ("0x", "0X"):
        return "a hexadecimal number"
    if t[:2] in ("0o", "0O") or (len(t) > 1 and t[0] == "0"):
        return "an octal number (a leading zero)"
    return "a number in YAML 1.1's spelling"


def _scalar_problem(loader: Any, node: yaml.ScalarNode, file: str) -> str | None:
    """Construct one scalar (cached by the loader for the document); a value Python refuses
    (an int of more than 4300 digits, ``2020-13-45`` as a date) becomes a line naming it, and
    so does a number spelled the YAML 1.1 way (``_yaml11_number_kind``): one strict spelling of
    numbers for every file and ``--set``, so ``0b1010`` is never silently 10 tokens."""
    try:
        value = loader.construct_object(node)
    except (ValueError, OverflowError) as exc:
        return f"{file}:{node.start_mark.line + 1}: cannot read this value: {str(exc).split(';')[0][:120]}"
    plain = _NUMBER_TAGS.get(node.tag)
    if plain is not None and not plain.match(node.value):
        shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
        # int -> str is capped at 4300 digits (CPython), and hex text is not: count, never print
        big = isinstance(value, int) and value.bit_length() > 128
        read = f"a number of about {int(value.bit_length() * 0.30103) + 1} digits" if big else repr(value)
        return (f"{file}:{node.start_mark.line + 1}: {shown} is {_yaml11_number_kind(node.value)}, which YAML 1.1 "
                f"reads as {read}: write the number in plain decimal (or quote it if it is text)")
    return None


def _merge_conflicts(loader: Any, value: yaml.Node, file: str, line: int) -> list[str]:
    """A key that two sources of one merge (``<<: [*a, *b]``) give with different values: YAML
    1.1's merge type gives the first source's ("keys in mapping nodes earlier in the sequence
    override keys specified in later mapping nodes", yaml.org/type/merge.html), PyYAML's
    constructor the last's, so the file means two things; one line per such key."""
    sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
    seen: dict[Any, tuple[Any, int]] = {}
    out: list[str] = []
    for src in sources:
        if not isinstance(src, yaml.MappingNode):
            continue
        for k_node, v_node in src.value:
            if not isinstance(k_node, yaml.ScalarNode):
                continue
            try:
                v = loader.construct_object(v_node, deep=True)
                hash(k_node.value)
            except (yaml.YAMLError, ValueError, OverflowError, TypeError):
                continue
            at = v_node.start_mark.line + 1
            if k_node.value in seen and seen[k_node.value][0] != v:
                out.append(f"{file}:{line}: merge key '<<': {k_node.value!r} comes from two of its sources with "
                           f"different values (lines {seen[k_node.value][1]} and {at}); YAML 1.1 takes the first, "
                           "this reader the last: keep one")
            seen.setdefault(k_node.value, (v, at))
    return out


def _walk(loader: Any, node: yaml.Node, path: tuple, file: str, out: Positions, problems: list[str]) -> None:
    out.setdefault(path, (file, node.start_mark.line + 1))
    if isinstance(node, yaml.ScalarNode):
        problem = _scalar_problem(loader, node, file)
        if problem:
            problems.append(problem)
    elif isinstance(node, yaml.MappingNode):
        first: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if isinstance(key_node, yaml.ScalarNode):
                key = key_node.value
                try:
                    ident = loader.construct_object(key_node)
                    hash(ident)
                except (ValueError, OverflowError) as exc:
                    problems.append(f"{file}:{line}: cannot read this key: {str(exc).split(';')[0][:120]}")
                    continue
                except (yaml.YAMLError, TypeError):
                    ident = key
                if ident == "<<" or key_node.tag == "tag:yaml.org,2002:merge":
                    # a merge key may repeat; SafeConstructor merges them in order
                    problems += _merge_conflicts(loader, value_node, file, line)
                elif not isinstance(ident, str):  # `5:`, `null:`, `yes:` (YAML 1.1 reads it as true)
                    problems.append(f"{file}:{line}: {key or 'null'}: a key here is text, but YAML reads this one as "
                                    f"{type(ident).__name__ if ident is not None else 'null'}; quote it or remove it")
                    continue
                elif ident in first:
                    problems.append(f"{file}:{line}: duplicate key {key!r} (first at line {first[ident]}); "
                                    "YAML keys are unique: merge the two blocks")
                else:
                    first[ident] = line
            else:
                key = None
            if key is None:
                continue
            # the key's own line names the key; children keep their own lines
            out[path + (key,)] = (file, line)
            _walk(loader, value_node, path + (key,), file, out, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(loader, item, path + (i,), file, out, problems)


def _yaml_error_line(exc: yaml.YAMLError, file: str) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    if context and not context.startswith("while "):  # "expected a single document ... but found another"
        problem = f"{context} {problem}"
    return f"{file}{line}: malformed YAML: {problem}"


#: How many distinct ``(text, file)`` parses ``parse_yaml_text`` keeps (a profile file and its
#: parent, the ``--set`` values of a command: a few; the differential fuzz loads the three shipped
#: profiles some ten thousand times in one process, each load once parsed in about 10 ms).
PARSED_KEPT = 256


def parse_yaml_text(text: str, file: str) -> tuple[Any, Positions]:
    """Parse YAML text once (libyaml) into ``(data, positions)``.

    Raises ``BadInput`` with one line per problem, each ``file:line: ...``: a syntax error,
    duplicate keys (both lines), aliases that expand past ``MAX_NODES`` nodes, nesting deeper
    than ``MAX_DEPTH``, a text longer than ``MAX_FILE_BYTES``.

    The same text under the same name is parsed once per process (the last ``PARSED_KEPT``
    kept); each call gets its own copy (``copy.deepcopy`` of the data, which keeps what an alias
    shares, and of the positions), so a caller may change what it gets. A text that fails is
    parsed again each time (nothing is kept for it).
    """
    data, positions = _parsed(text, file)
    return copy.deepcopy(data), dict(positions)


@functools.lru_cache(maxsize=PARSED_KEPT)
def _parsed(text: str, file: str) -> tuple[Any, Positions]:
    """``parse_yaml_text``'s parse, kept: the caller copies what it returns."""
    if len(text) > MAX_FILE_BYTES:
        raise BadInput(f"{file}: {len(text)} characters; a profile or fleet file is at most {MAX_FILE_BYTES // 1024} KiB")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a --set value from bytes that are not UTF-8 (Python's surrogateescape)
        bad = text[exc.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"U+{ord(bad):04X}"
        raise BadInput(f"{file}: not UTF-8 text: {byte} at offset {exc.start}") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        _check_graph(node, file)
        positions: Positions = {}
        problems: list[str] = []
        _walk(loader, node, (), file, positions, problems)
        if problems:
            raise _Problems(problems)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise BadInput(_yaml_error_line(exc, file)) from None
    except _Problems as exc:
        raise BadInput(*exc.lines) from None
    except RecursionError:
        raise BadInput(f"{file}: nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    return data, positions


def read_profile_text(path: Path) -> str:
    """The text of a profile file: at most ``MAX_FILE_BYTES``, strict UTF-8.

    Raises ``BadInput`` naming the file: unreadable, a directory, too large, or not UTF-8 (with
    the byte offset and line of the first bad byte).
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not a profile file") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise BadInput(f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB; profile and fleet files are a few KB of YAML")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise BadInput(f"{path}:{line}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}; "
                       "save the profile as UTF-8") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\x00" in text:
        off = raw.index(b"\x00")
        line = raw.count(b"\n", 0, off) + 1
        raise BadInput(f"{path}:{line}: NUL byte at offset {off}; profile and fleet files are text")
    return text


def load_yaml_with_positions(path: Path) -> tuple[Any, Positions]:
    """Read and parse a YAML file; ``BadInput`` naming the file when it cannot be read or parsed."""
    return parse_yaml_text(read_profile_text(path), str(path))


def position_of(positions: Positions, loc: tuple) -> tuple[str, int] | None:
    """The position of ``loc``, or of its nearest ancestor that has one."""
    while True:
        if loc in positions:
            return positions[loc]
        if not loc:
            return None
        loc = loc[:-1]


# --------------------------------------------------------------------------- validation errors


def _strip_union_tags(loc: tuple) -> tuple:
    """pydantic puts the union member's tag into ``loc`` (e.g. ``'literal['auto']'``,
    ``'float'``); drop those so the path matches the YAML keys."""
    out = []
    for part in loc:
        if isinstance(part, str) and (part.startswith(("literal[", "function-")) or part in {
            "float", "int", "str", "list[int]", "constrained-float", "list[literal[", "bool",
        } or part.startswith("list[")):
            continue
        out.append(part)
    return tuple(out)


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (``Annotated``, ``Optional``, unions), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = model_in(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(loc: tuple, root: type[BaseModel]) -> str | None:
    """The closest known key to an unknown one at ``loc`` (difflib), for the error line.
    ``root``: the model at the top of ``loc``; list indexes are skipped."""
    import difflib

    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = model_in(model.model_fields[part].annotation)
    if model is None or not isinstance(loc[-1], str):
        return None
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.75)
    return close[0] if close else None


def format_validation_errors(exc: ValidationError, pos: Positions, origin: str, root: type[BaseModel], *,
                             reword: Callable[[tuple, dict], str | None] | None = None) -> list[tuple[int, str]]:
    """A pydantic ``ValidationError`` of a document read with positions, as ``(line, text)``
    pairs, one per offending key: ``file:line: dotted.key: message (got value)``, sorted by
    file and line. ``pos``: the document's positions (``load_yaml_with_positions``); ``origin``:
    the file named when a key has no position; ``root``: the model validated (its field names
    give the did-you-mean of an unknown key).

    A value that fails every member of a union (``auto`` or a number > 0) yields one error per
    member with the same key; they are joined into one line. ``reword(loc, error)``: a message
    in the document's own words for one error (``None``: the default wording).
    """
    by_loc: dict[tuple, dict] = {}
    for err in exc.errors(include_url=False):
        loc = _strip_union_tags(tuple(err["loc"]))
        own = reword(loc, dict(err)) if reword is not None else None
        if own is not None:
            msg = own
        elif err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "model_type":  # a section given a scalar: say it in profile words, not pydantic's class names
            msg = f"expected a mapping of {'.'.join(str(p) for p in loc) or 'profile'} keys"
        else:
            msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            guess = _did_you_mean(loc, root)
            if guess:
                msg += f" (did you mean {guess}?)"
        entry = by_loc.setdefault(loc, {"msgs": [], "err": err, "types": []})
        entry["own"] = entry.get("own", False) or own is not None
        entry["types"].append(err["type"])
        if msg not in entry["msgs"]:
            entry["msgs"].append(msg)
    # A union like ``'all' | list[int]`` fails on both members; when the list member names a
    # deeper item, the literal member's "Input should be 'all'" only hides it: drop that one.
    for loc in [k for k, e in by_loc.items() if all(er == "literal_error" for er in e["types"])]:
        if any(len(other) > len(loc) and other[: len(loc)] == loc for other in by_loc):
            del by_loc[loc]
    lines: list[tuple[str, int, str]] = []
    for loc, entry in by_loc.items():
        err = entry["err"]
        dotted = ".".join(str(p) for p in loc) or "(profile)"
        where = position_of(pos, loc)
        file, line = where if where else (origin, 0)
        got = err.get("input")
        msgs = entry["msgs"]
        prefix = "Input should be "
        if len(msgs) > 1 and all(m.startswith(prefix) for m in msgs):  # union members
            text = prefix + " or ".join(m.removeprefix(prefix) for m in msgs)
        else:
            text = " or ".join(msgs)
        got_s = ""
        named = entry.get("own", False)  # a reworded message quotes the value itself
        if (err["type"] != "missing" and not named and got is not None and not isinstance(got, (dict, list))
                and "(got" not in text and "did you mean" not in text):
            got_s = f" (got {_short_repr(got)})"
        where_s = f"{file}:{line}" if line else file
        # an override's place already names its key: "--set a.b: message", not "--set a.b: a.b: ..."
        key_s = "" if file == f"--set {dotted}" else f"{dotted}: "
        if file.startswith(f"--set {dotted}.") and text.startswith("unknown key"):
            # a section the override created: "--set server.tp_size: unknown key server"
            key_s, text = "", text.replace("unknown key", f"unknown key {dotted}", 1)
        for part in text.split("\n"):  # a validator's several problems: one line each
            lines.append((file, line, f"{where_s}: {key_s}{part}{got_s}"))
    lines.sort(key=lambda t: (t[0], t[1]))
    return [(ln, t) for _, ln, t in lines]


def _short_repr(value: Any, limit: int = 60) -> str:
    """``repr`` for an error line: at most ``limit`` characters; an int too long to print in
    decimal (Python refuses past 4300 digits) is named by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {len(str(value)) if value.bit_length() < 14000 else 'thousands of'} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
