"""Check an SGLang server argv against a release's flag catalog and the capabilities' flags.

Pure: reads only the committed catalog of the release (``releases/VERSION/flags.json`` under
``paths.catalog_dir()``, ``escha_deploy.sglang.releases``; the default release when none is named),
written by ``scripts/gen_flag_catalog.py`` from the real parser and re-checked by
``.ci/check-flag-catalog.sh``, once per process and release (``load_catalog`` is cached; about
2 ms).
No torch, no sglang import.

``check_argv(argv, capabilities)`` mirrors what ``argparse`` does in SGLang's
``srt/server_args.py:prepare_server_args`` (``argparse.ArgumentParser(prog="sglang serve")``
plus ``ServerArgs.add_cli_args``): option lookup (``--flag value`` and ``--flag=value``),
how many values each action takes (``nargs`` None, 0, ``?``, ``*``, ``+``, N), a value that
looks like a flag ends the values (negative numbers do not, as the parser has no option that
looks like one), each value converted by the action's type (``int``, ``float``,
``human_readable_int``, ``json.loads``, ``json_list_type``, ``nullable_str``, ``str``,
``parse_cuda_graph_config_arg``) and then checked against its choices, stray values, and
required flags (``--model-path``). Each flag that passes is reported ``verified`` (the real
parser accepts it) or ``declared`` (a needed capability adds the flag, or the value comes from
choices the capability adds; see ``capabilities.DeclaredFlag``): a declared flag is what the
capability says its patch accepts, not something checked against a real parser.

Stricter than argparse, on purpose (a rendered argv should be exact): an abbreviation that
argparse would expand (``--hicache-rat``) is an error naming the full flag; ``-h``/``--help``
is an error (the server would print help and exit); a removed flag (sglang's
``DeprecatedAction`` with an error message) is an error, as in the parser. Warnings, not
errors: a deprecated flag, a flag given more than once (the last value wins, as in argparse),
``--config`` (the YAML file's options are not checked), and ``--cuda-graph-config`` beyond its
phase and key names.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.sglang import capabilities as _caps
from escha_deploy.sglang import releases

CATALOG_SCHEMA = 1
LAUNCH_MODULE = "sglang.launch_server"

Status = Literal["verified", "declared"]


def catalog_path(version: str | None = None) -> Path:
    """The committed catalog file of an SGLang release (default: the default release)."""
    return releases.release_file(version, "flags.json")


# --------------------------------------------------------------------------------------------
# The catalog
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlagSpec:
    """One argparse action of the server parser, as the catalog records it.

    ``nargs``: argparse's value (None = exactly one value, 0 = none, ``?``, ``*``, ``+`` or
    an int). ``type``: ``str``, ``int``, ``float`` or ``module.function``; None for actions
    that take no value. ``choices``: after type conversion, the allowed values. ``declared_by``:
    the capability that adds this flag (None for the stock parser). ``declared_choices``:
    choices a capability adds to this flag, value -> capability.
    """

    flags: tuple[str, ...]
    dest: str
    action: str
    nargs: int | str | None
    type: str | None
    choices: tuple[Any, ...] | None
    required: bool = False
    deprecated: bool = False
    new_flag: str | None = None
    removed: str | None = None
    declared_by: str | None = None
    declared_choices: tuple[tuple[Any, str], ...] = ()


@dataclass(frozen=True)
class Catalog:
    """The server parser of one SGLang version: actions in registration order, by option string."""

    version: str
    actions: tuple[FlagSpec, ...]
    by_option: dict[str, FlagSpec]

    def option_strings(self) -> list[str]:
        return list(self.by_option)


def load_catalog(version: str | None = None) -> Catalog:
    """Read the committed catalog of ``version`` (default: the default release), once per
    process and release.

    Raises ``FileNotFoundError`` when no catalog exists for ``version`` and ``ValueError`` when
    its schema is not ``CATALOG_SCHEMA``: both are packaging bugs, not user errors.
    """
    return _load_catalog(version or releases.default_release())


@functools.lru_cache(maxsize=8)
def _load_catalog(version: str) -> Catalog:
    raw = json.loads(catalog_path(version).read_text(encoding="utf-8"))
    if raw.get("schema") != CATALOG_SCHEMA or raw.get("version") != version:
        raise ValueError(
            f"{catalog_path(version)}: schema {raw.get('schema')!r} version {raw.get('version')!r},"
            f" expected schema {CATALOG_SCHEMA} version {version}"
        )
    actions = tuple(
        FlagSpec(
            flags=tuple(a["flags"]),
            dest=a["dest"],
            action=a["action"],
            nargs=a.get("nargs"),
            type=a.get("type"),
            choices=None if a.get("choices") is None else tuple(a["choices"]),
            required=bool(a.get("required")),
            deprecated=bool(a.get("deprecated")),
            new_flag=a.get("new_flag"),
            removed=a.get("removed"),
        )
        for a in raw["actions"]
    )
    by_option = {opt: spec for spec in actions for opt in spec.flags}
    return Catalog(version=version, actions=actions, by_option=by_option)


def _declared_type_name(t: str) -> str | None:
    return None if t == "bool" else t


@functools.lru_cache(maxsize=64)
def _parser_for(capabilities: frozenset[str], version: str | None = None) -> Catalog:
    """The catalog with the flags the given capabilities declare merged in.

    A declared flag that the catalog already has adds its ``choices`` (as declared choices);
    a new one becomes an action of its own (``bool`` -> no value, like ``store_true``).
    Raises ``ValueError`` when a declaration disagrees with the catalog about a flag's dest or
    names a dest the catalog spells differently: a bug in ``capabilities.py``.
    """
    base = load_catalog(version)
    by_option = dict(base.by_option)
    added: list[FlagSpec] = []
    for name in _caps.CAPABILITIES:
        if name not in capabilities:
            continue
        for decl in _caps.declared_flags({name}):
            existing = by_option.get(decl.flag)
            if existing is not None:
                if existing.dest != decl.dest:
                    raise ValueError(
                        f"capability {name}: {decl.flag} has dest {existing.dest} in the "
                        f"catalog, declared as {decl.dest}"
                    )
                new_choices = tuple(
                    (c, name) for c in decl.choices
                    if existing.choices is None or c not in existing.choices
                )
                merged = FlagSpec(
                    **{
                        **existing.__dict__,
                        "declared_choices": existing.declared_choices + new_choices,
                    }
                )
                for opt in merged.flags:
                    by_option[opt] = merged
                continue
            clash = [s for s in base.actions if s.dest == decl.dest]
            if clash:
                raise ValueError(
                    f"capability {name}: declares {decl.flag} for dest {decl.dest}, which the "
                    f"catalog spells {clash[0].flags[0]}"
                )
            spec = FlagSpec(
                flags=(decl.flag,),
                dest=decl.dest,
                action="declared",
                nargs=0 if decl.type == "bool" else None,
                type=_declared_type_name(decl.type),
                choices=tuple(decl.choices) or None,
                declared_by=name,
            )
            added.append(spec)
            by_option[decl.flag] = spec
    return Catalog(version=base.version, actions=base.actions + tuple(added), by_option=by_option)


# --------------------------------------------------------------------------------------------
# Value types: the conversions argparse applies (each raises ValueError when argparse would fail)
# --------------------------------------------------------------------------------------------


def _human_readable_int(value: str) -> int:
    """``sglang/srt/utils/common.py:human_readable_int`` (0.5.19), re-implemented.

    SI suffixes k, M, G, T (decimals allowed: ``25.6k`` = 25600) and IEC Ki, Mi, Gi, Ti
    (integers only); case-sensitive; otherwise ``int(value)``. The wheel test compares this
    with the real function.
    """
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise ValueError(f"decimals are not allowed with IEC suffix {suffix}")
            return int(number) * iec[suffix]
        try:
            return int(Decimal(number) * si[suffix])
        except InvalidOperation as e:  # pragma: no cover - the regex admits only digits
            raise ValueError(str(e)) from None
    return int(value)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is infinity when parsed as a double")
    return number


def _json_list_type(value: str) -> Any:
    """``common.py:json_list_type``: ``orjson.loads``, which refuses NaN, Infinity and numbers
    that overflow a double (``1e400``), where ``json.loads`` accepts them."""
    return json.loads(value, parse_constant=_reject_constant, parse_float=_finite_float)


def _cuda_graph_config(value: str, version: str | None = None) -> Any:
    """``cuda_graph_config.py:parse_cuda_graph_config_arg``: a JSON object of phase objects,
    each key one of the release's ``ALLOWED_KEYS_PER_PHASE`` (``facts.yaml:
    cuda_graph_config_keys``)."""
    allowed = releases.load_release(version).cuda_graph_config_keys
    phases = {"decode": allowed.decode, "prefill": allowed.prefill}
    parsed = json.loads(value)
    if not isinstance(parsed, dict):
        raise ValueError(f"must be a JSON object, got {type(parsed).__name__}")
    for phase, settings in parsed.items():
        if phase not in phases:
            raise ValueError(f"unknown phase {phase!r}, expected one of {tuple(phases)}")
        if not isinstance(settings, dict):
            raise ValueError(f"[{phase!r}] must be a JSON object")
        for key in settings:
            if key not in phases[phase]:
                raise ValueError(f"[{phase!r}]: unknown key {key!r}")
    return parsed


def _cuda_graph_backend(value: str) -> str:
    """``cuda_graph_config.py:parse_cuda_graph_backend_arg`` (0.5.23): refuses the retired
    ``tc_piecewise`` before the choices are checked."""
    if value == "tc_piecewise":
        raise ValueError("tc_piecewise was removed; select breakable, full, or disabled")
    return value


def _nullable_str(value: str) -> str | None:
    return None if not value or value == "None" else value


#: Type name as the catalog writes it -> (short name for messages, conversion).
TYPES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "str": ("str", str),
    "int": ("int", int),
    "float": ("float", float),
    "sglang.srt.utils.common.human_readable_int": ("human_readable_int", _human_readable_int),
    "sglang.srt.utils.common.nullable_str": ("nullable_str", _nullable_str),
    "sglang.srt.utils.common.json_list_type": ("JSON", _json_list_type),
    "json.loads": ("JSON", json.loads),
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": (
        "cuda graph config JSON", _cuda_graph_config,
    ),
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg": (
        "cuda graph backend", _cuda_graph_backend,
    ),
}

#: Conversions whose rules differ per release: called with the release as well.
_PER_RELEASE = frozenset({_cuda_graph_config})


# --------------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------------


class FlagUse(BaseModel):
    """One flag as it appears in the argv, with the values it took.

    ``flag`` as written (without ``=value``); ``canonical`` the catalog's first spelling;
    ``status`` ``verified`` (the real parser accepts it) or ``declared`` (``capability``
    adds the flag or the value's choice).
    """

    model_config = ConfigDict(frozen=True)
    flag: str
    canonical: str
    dest: str
    values: tuple[str, ...] = ()
    status: Status
    capability: str | None = None


class FlagProblem(BaseModel):
    """One problem, naming the flag (or the token) it is about."""

    model_config = ConfigDict(frozen=True)
    flag: str
    message: str

    def line(self) -> str:
        return f"{self.flag}: {self.message}"


class FlagCheckResult(BaseModel):
    """What ``check_argv`` found: each flag's status, the errors and the warnings."""

    model_config = ConfigDict(frozen=True)
    runtime: str = "sglang"
    version: str = Field(default_factory=releases.default_release, description="the SGLang release checked against")
    capabilities: tuple[str, ...] = Field(default=(), description="the capabilities checked with")
    flags: tuple[FlagUse, ...] = ()
    errors: tuple[FlagProblem, ...] = ()
    warnings: tuple[FlagProblem, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    def declared(self) -> list[FlagUse]:
        """The flags accepted only because a capability declares them."""
        return [f for f in self.flags if f.status == "declared"]

    def error_lines(self) -> list[str]:
        return [e.line() for e in self.errors]

    def raise_for_errors(self, where: str = "argv") -> None:
        """Raise ``errors.BadInput`` with one line per error (``where: --flag: message``)."""
        if self.errors:
            from escha_deploy.utils.errors import BadInput

            raise BadInput(
                *(f"{where}: {e.line()}" for e in self.errors),
                hint=f"the flags of sglang {self.version} are in {catalog_path(self.version)}",
            )


# --------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's _negative_number_matcher


def server_flags(argv: list[str]) -> tuple[list[str], FlagProblem | None]:
    """The part of ``argv`` the server parser sees.

    Accepts a full command (``python -m sglang.launch_server ...``, ``sglang serve ...``)
    or a bare flag list (first token starts with ``-``, or an empty list). Returns the flags
    and, for a command that is neither, a problem naming ``argv[0]``.
    """
    if not argv or argv[0].startswith("-"):
        return list(argv), None
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == LAUNCH_MODULE:
            return list(argv[i + 2:]), None
    if len(argv) >= 2 and Path(argv[0]).name == "sglang" and argv[1] == "serve":
        return list(argv[2:]), None
    return [], FlagProblem(
        flag=argv[0],
        message=f"not an SGLang server command (expected `python -m {LAUNCH_MODULE} ...`, "
        "`sglang serve ...` or a list of flags)",
    )


def _is_option(token: str, options: dict[str, FlagSpec]) -> bool:
    """Whether argparse reads ``token`` as a flag (``ArgumentParser._parse_optional``, 3.11).

    Known flags (also ``--flag=value`` and unique or ambiguous ``--`` prefixes) are flags; then
    negative numbers (``-1``, ``-.5``) are values, since the server parser has no option that
    looks like one; then a token with a space is a value; anything else starting with ``-``
    is a flag.
    """
    if not token or token[0] != "-":
        return False
    if token in options:
        return True
    if len(token) == 1:
        return False
    head = token.split("=", 1)[0]
    if head in options:
        return True
    if token.startswith("--") and any(o.startswith(head) for o in options):
        return True
    if _NEGATIVE_NUMBER.match(token):
        return False
    return " " not in token


def _expected(nargs: int | str | None) -> str:
    return {None: "one value", "?": "at most one value", "*": "values", "+": "at least one value"}.get(
        nargs, f"{nargs} values"  # type: ignore[arg-type]
    )


def _missing_capability(flag: str, value: str | None = None) -> str:
    """``; the capability X declares it`` when a capability not asked for would accept this."""
    names = [
        name for name, cap in _caps.CAPABILITIES.items()
        for d in cap.flags
        if d.flag == flag and (value is None or value in d.choices)
    ]
    if not names:
        return ""
    return f"; declared by the capability {', '.join(dict.fromkeys(names))}, not among those needed"


def _describe_choices(spec: FlagSpec) -> str:
    shown = list(spec.choices or ()) + [c for c, _ in spec.declared_choices]
    return ", ".join(str(c) for c in shown)


def check_argv(
    argv: list[str],
    capabilities: set[str] | frozenset[str] | tuple[str, ...] = frozenset(),
    *,
    version: str | None = None,
    require_model: bool = True,
) -> FlagCheckResult:
    """Check a server argv as SGLang's parser would, plus the capabilities' declared flags.

    ``argv``: the full command or the bare flags (``server_flags``). ``capabilities``: the
    capabilities the profile needs (and the runtime provides); their ``DeclaredFlag``s from
    ``capabilities.declared_flags`` are accepted and reported ``declared``. Unknown capability
    names declare nothing. ``require_model=False`` skips the required-flag check (for a
    fragment such as a profile's extra arguments).

    Returns a ``FlagCheckResult``; never raises for a bad argv (``raise_for_errors`` does).
    Raises ``ValueError`` only for a bug in ``capabilities.py`` (see ``_parser_for``).
    """
    caps = frozenset(capabilities)
    version = version or releases.default_release()
    parser = _parser_for(caps, version)
    flags_part, head_problem = server_flags(list(argv))
    errors: list[FlagProblem] = [head_problem] if head_problem else []
    warnings: list[FlagProblem] = []
    uses: list[FlagUse] = []
    seen: dict[str, int] = {}

    tokens = flags_part
    options = parser.by_option
    i = 0
    n = len(tokens)
    while i < n:
        token = tokens[i]
        i += 1
        if token == "--":
            errors.append(FlagProblem(flag=token, message="not expected in a server argv"))
            continue
        if not _is_option(token, options):
            errors.append(FlagProblem(flag=token, message="unexpected value: no flag takes it "
                                      "(the server parser has no positional arguments)"))
            continue

        option, eq, explicit = token.partition("=") if token.startswith("--") else (token, "", "")
        spec = options.get(option)
        if spec is None:
            prefixed = [o for o in options if option.startswith("--") and o.startswith(option)]
            if len(prefixed) == 1:
                errors.append(FlagProblem(flag=option, message=f"abbreviation of {prefixed[0]}; "
                                          "write the flag in full"))
            elif prefixed:
                errors.append(FlagProblem(flag=option, message="ambiguous abbreviation of "
                                          + ", ".join(sorted(prefixed)[:5])))
            else:
                import difflib  # only an unknown flag needs a suggestion

                near = difflib.get_close_matches(option, options, n=1, cutoff=0.75)
                hint = f"; did you mean {near[0]}?" if near else ""
                caps_txt = f" or to the capabilities {', '.join(sorted(caps))}" if caps else ""
                why = _missing_capability(option) or hint
                errors.append(FlagProblem(flag=option, message=f"unknown to sglang {version}"
                                          f"{caps_txt}{why}"))
            # Skip the values an unknown flag may have had, so they are not reported twice.
            while not eq and i < n and not _is_option(tokens[i], options):
                i += 1
            continue

        # The values: an explicit "=value" (exactly one), else the following non-flag tokens.
        if eq:
            if spec.nargs == 0:
                errors.append(FlagProblem(flag=option, message=f"takes no value (got ={explicit})"))
                continue
            if isinstance(spec.nargs, int) and spec.nargs != 1:
                errors.append(FlagProblem(flag=option, message=f"expected {spec.nargs} values"))
                continue
            values = [explicit]
        else:
            following: list[str] = []
            while i + len(following) < n and not _is_option(tokens[i + len(following)], options):
                following.append(tokens[i + len(following)])
            if spec.nargs is None:
                take = 1
            elif spec.nargs == "?":
                take = min(1, len(following))
            elif spec.nargs in ("*", "+"):
                take = len(following)
            else:
                take = int(spec.nargs)
            if len(following) < take or (spec.nargs == "+" and not following):
                errors.append(FlagProblem(flag=option, message=f"expected {_expected(spec.nargs)}"))
                continue
            values = following[:take]
            i += take

        if option in ("-h", "--help") or spec.action == "_HelpAction":
            errors.append(FlagProblem(flag=option, message="prints help and exits; not a server flag"))
            continue
        if spec.removed:
            errors.append(FlagProblem(flag=option, message=spec.removed))
            continue

        status: Status = "declared" if spec.declared_by else "verified"
        capability = spec.declared_by
        bad = False
        if values and (spec.type or "str") not in TYPES:
            errors.append(FlagProblem(flag=option, message=f"catalog type {spec.type} is unknown to "
                                      "escha_deploy.sglang.flagcheck"))
            continue
        type_name, convert = TYPES[spec.type or "str"]
        for value in values:
            try:
                converted = convert(value, version) if convert in _PER_RELEASE else convert(value)
            except (ValueError, TypeError) as e:
                detail = f" ({e})" if type_name not in ("int", "float") else ""
                errors.append(FlagProblem(flag=option, message=f"invalid {type_name} value "
                                          f"{value!r}{detail}"))
                bad = True
                continue
            if spec.choices is None and not spec.declared_choices:
                continue
            if spec.choices is not None and converted in spec.choices:
                continue
            by_cap = next((cap for c, cap in spec.declared_choices if c == converted), None)
            if by_cap is not None:
                status, capability = "declared", by_cap
                continue
            if spec.choices is None:  # free value; the capability only names extra ones
                continue
            errors.append(FlagProblem(flag=option, message=f"invalid choice {value!r} (choose from "
                                      f"{_describe_choices(spec)}){_missing_capability(option, value)}"))
            bad = True
        if bad:
            continue

        canonical = spec.flags[0]
        seen[spec.dest] = seen.get(spec.dest, 0) + 1
        if seen[spec.dest] == 2:
            warnings.append(FlagProblem(flag=option, message=f"sets {spec.dest} more than once; "
                                        "the last one wins"))
        if spec.deprecated:
            instead = f"; use {spec.new_flag}" if spec.new_flag else ""
            warnings.append(FlagProblem(flag=option, message=f"deprecated in sglang {version}{instead}"))
        if canonical == "--config":
            warnings.append(FlagProblem(flag=option, message="the options in the YAML file are not "
                                        "checked"))
        uses.append(FlagUse(flag=option, canonical=canonical, dest=spec.dest, values=tuple(values),
                            status=status, capability=capability))

    if require_model and head_problem is None:
        given = {u.dest for u in uses} | {
            parser.by_option[e.flag].dest for e in errors if e.flag in parser.by_option
        }
        for spec in parser.actions:
            if spec.required and spec.dest not in given:
                errors.append(FlagProblem(flag="/".join(spec.flags), message="required"))
    return FlagCheckResult(
        version=version, capabilities=tuple(sorted(caps)), flags=tuple(uses),
        errors=tuple(errors), warnings=tuple(warnings),
    )
