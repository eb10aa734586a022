"""Option aliases shared by several verbs, declared once so names and help never diverge."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Annotated, Optional

import typer


class OutputFormat(str, enum.Enum):
    table = "table"
    json = "json"


#: The profile `plan`, `up` and `compose` use without --profile: the reference box served without
#: a fork's commits (FP8 KV, the GPTQ-Int4 model), so a plain `up` or `compose` can run on the
#: `Dockerfile.hicache` image. The reference profile itself, `rtx5060ti-tp2`, needs the fork's
#: `int2-kv` and `w2-weights` capabilities (README.md, "Bring your fork") and is always named.
DEFAULT_PROFILE = "rtx5060ti-tp2-fp8"

ProfileOpt = Annotated[
    str,
    typer.Option(
        "--profile", "-p",
        help="Profile name (see `escha-deploy profiles list`) or profile file (.yaml, .yml, .json); a "
        "shipped name wins over a same-named file here (./NAME reads the file NAME, else NAME.yaml, "
        "NAME.yml or NAME.json).",
    ),
]
OptionalProfileOpt = Annotated[
    Optional[str],
    typer.Option("--profile", "-p", help="Profile name or profile file (.yaml, .yml, .json); a shipped name "
                 "wins over a same-named file here (./NAME reads the file NAME, else NAME.yaml, NAME.yml or NAME.json)."),
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--set",
        help="Override a profile key: --set hicache.hicache_ratio=1.5 (dotted path; repeatable).",
    ),
]
FormatOpt = Annotated[
    OutputFormat,
    typer.Option("--format", "-f", help="table for people, json for scripts (stdout only)."),
]
#: ``--format`` without ``-f``, for a verb where ``-f`` means something else (``logs -f`` is
#: ``--follow``, as in ``docker logs -f``): within a command a short option has one meaning.
FormatLongOpt = Annotated[
    OutputFormat,
    typer.Option("--format", help="table for people, json for scripts (stdout only)."),
]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Print what would run (secrets redacted) and exit.")
]
FactsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--facts",
        help="Plan from this facts file (host facts, doctor findings, GPUs; JSON) instead of this "
        "machine; default: $ESCHA_FACTS when set.",
    ),
]


def number_option(least: float | None = None, most: float | None = None, *,
                  integer: bool = False) -> Callable[[str], float | int]:
    """A ``parser=`` for a numeric option: ``units.parse_number`` (the profile keys' reading:
    plain decimal, no ``1_5`` (Python's ``float`` reads 15), no ``inf``/``nan``, no ``0x10``;
    ``integer``: a whole number), then ``least <= value <= most``. Raises ``typer.BadParameter``
    (exit 2, naming the option) otherwise. Use it as
    ``typer.Option("--timeout", parser=number_option(1, 3600))``; ``min``/``max`` are not
    given then (a parser replaces click's range type)."""
    from escha_deploy.utils.units import parse_number

    def parse(text: str) -> float | int:
        try:
            value = parse_number(text, integer=integer)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        if (least is not None and value < least) or (most is not None and value > most):
            lo = "" if least is None else f"{least:g}<="  # click's own wording for a range
            hi = "" if most is None else f"<={most:g}"
            raise typer.BadParameter(f"{str(text).strip()} is not in the range {lo}x{hi}")
        return value

    # typer names the value after the parser (``--max-tokens <parse>``): name it for what it reads
    parse.__name__ = "integer" if integer else "number"
    return parse
