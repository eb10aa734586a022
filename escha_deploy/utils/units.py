"""Sizes: bytes are ``int`` everywhere inside; units only at the edges.

GB = 1e9 bytes (what SGLang prints for host pools and takes in ``--hicache-size``); GiB = 2**30
(SGLang's GPU-memory code and its 10 GiB host reserve). ``parse_size`` refuses a bare number,
since pydantic's ``ByteSize`` would read ``12`` as 12 bytes (checked on pydantic 2.14.4), a trap for a field people think of in GB.
"""

from __future__ import annotations

import re
from typing import Any

GB = 10**9
GiB = 2**30
MB = 10**6
MiB = 2**20

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
#: Largest size accepted anywhere (bytes): 1 PiB. Above every VRAM, host RAM or L3 cap a small
#: box can have, and far below where bytes-as-int arithmetic or a float conversion goes wrong.
MAX_SIZE = 2**50
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*$")


def _bare_number_message(value: Any) -> str:
    """Suggest units that make sense for the number: 12 -> 12GiB or 12GB; 12884901888 -> B."""
    try:
        big = float(value) >= 100_000
    except ValueError:
        big = False
    if big:
        return f"a bare number is ambiguous: add a unit, e.g. {value}B for bytes"
    return f"a bare number is ambiguous: write {value}GiB or {value}GB"


def parse_size(value: Any) -> int:
    """Parse ``"12GiB"``, ``"32 GB"``, ``"512MiB"`` or ``"0B"`` into bytes (``int``).

    Raises ``ValueError`` (which pydantic turns into a validation error naming the field) for a
    bare number, an unknown unit, or the Kubernetes spelling ``12Gi``.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size with a unit such as 12GiB or 12GB, got {value!r}")
    if isinstance(value, (int, float)):
        raise ValueError(_bare_number_message(value))
    if not isinstance(value, str):
        raise ValueError(f"expected a size such as 12GiB, got {value!r}")
    if re.fullmatch(r"\s*[0-9]+(?:\.[0-9]+)?\s*", value):
        raise ValueError(_bare_number_message(value.strip()))
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(f"not a size: {value!r} (write e.g. 12GiB, 32GB, 512MiB)")
    number, unit = m.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"unknown unit {unit!r} in {value!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    # Decimal quantities round to the nearest byte ("1.31GiB" = 1,406,592,696 B); exact
    # arithmetic, so a 400-digit number is refused instead of overflowing a float.
    from fractions import Fraction

    exact = Fraction(number) * factor if len(number) <= 40 else Fraction(MAX_SIZE + 1)
    if exact > MAX_SIZE:
        shown = value.strip() if len(value.strip()) <= 40 else value.strip()[:37] + "..."
        raise ValueError(f"{shown!r} is larger than {MAX_SIZE // 2**50} PiB, the most any size here can be")
    return round(exact)


def decimal_letter_note(value: str) -> str | None:
    """For a size written with a bare letter unit (``16G``, ``512M``, ``1T``), what it was read as
    and what a Docker user likely meant: ``parse_size`` reads ``G`` as GB (1e9), where Docker's
    ``--memory 16g`` and ``free -g`` mean GiB (2**30). ``None`` for every other spelling."""
    m = _SIZE_RE.match(value) if isinstance(value, str) else None
    if not m or m.group(2).lower() not in ("k", "m", "g", "t"):
        return None
    number, letter = m.group(1), m.group(2).upper()
    read, binary = parse_size(f"{number}{letter}B"), parse_size(f"{number}{letter}iB")
    return (f"{value.strip()} was read as {number} {letter}B = {read:,} B (decimal, 1 {letter}B = "
            f"{_UNITS[letter.lower() + 'b']:,} B); {letter}iB is binary: write {number}{letter}iB for {binary:,} B, "
            f"what Docker's {number}{letter.lower()} means")


def size_field() -> Any:
    """A pydantic ``BeforeValidator`` that turns a size string into bytes."""
    from pydantic import BeforeValidator

    return BeforeValidator(parse_size, json_schema_input_type=str)


#: The most ``--hicache-size`` accepted (GB per rank; 1 PB): above any box's host memory.
MAX_HICACHE_GB = 10**6
_HICACHE_GB_RE = re.compile(r"^\s*([0-9]{1,12})\s*(?:[Gg][Bb])?\s*$")


def parse_hicache_gb(value: Any, *, allow_zero: bool = True) -> int:
    """SGLang's ``--hicache-size`` (sglang/srt/server_args.py ``hicache_size: int``, GB per rank,
    GB = 1e9): a whole number written ``30`` or ``30GB`` (``30 gb`` too), or an int. One parser
    for the profile key ``hicache.hicache_size``, ``--set`` and ``plan --hicache-size``.
    ``allow_zero``: the profile's 0 means "use the ratio"; the CLI wants a size. Raises
    ``ValueError`` for anything else (``30GiB`` and ``7.5`` are not whole GB)."""
    hint = "a whole number of GB (1e9) per rank, e.g. 30 or 30GB"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected {hint} (got {value!r})")
    m = _HICACHE_GB_RE.match(str(value))
    if not m:
        shown = str(value)[:40]
        raise ValueError(f"expected {hint} (got {shown!r})")
    n = int(m.group(1))
    if n == 0 and not allow_zero:
        raise ValueError(f"expected {hint} greater than 0 (got {str(value)[:40]!r})")
    if n > MAX_HICACHE_GB:
        raise ValueError(f"{n} GB per rank is more host memory than any box has: must be less than or "
                         f"equal to {MAX_HICACHE_GB}")
    return n


def hicache_gb_field() -> Any:
    """A pydantic ``BeforeValidator`` for ``hicache_size``: ``parse_hicache_gb`` (0 allowed)."""
    from pydantic import BeforeValidator

    return BeforeValidator(parse_hicache_gb)


#: A number as text, the one spelling every numeric option and key takes: decimal digits, an
#: optional fraction and exponent (``1.5``, ``.5``, ``2e-3``). Not Python's ``float()`` or
#: ``int()`` spellings beyond that (``1_5`` is 15 to Python, ``inf``, ``nan``, ``0x10``), nor
#: YAML 1.1's (``0b1010``, ``012`` as octal, ``1:30`` as 90: ``yamlpos`` refuses those).
_DECIMAL_RE = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,4})?$")
_INTEGER_RE = re.compile(r"^[-+]?[0-9]{1,19}$")


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {text!r}"
    return repr(value)


def parse_number(value: Any, *, integer: bool = False) -> float | int:
    """The one strict reading of a number, for every numeric profile key (``Number``) and
    command-line option (``cli.options.number_option``): an ``int`` or ``float`` (never a
    ``bool``: YAML's ``true`` is not 1), or text in plain decimal (``_DECIMAL_RE``; ``1_5``,
    ``0x10``, ``inf`` and ``nan`` are refused), finite. ``integer``: a whole number, written
    without a fraction (``64``, not ``64.0`` or ``6.4e1``). Returns ``float`` (``int`` when
    ``integer``). Raises ``ValueError`` with the reason; bounds are the caller's."""
    import math

    if isinstance(value, bool):
        raise ValueError(f"expected a number (got {_shown(value)})")
    if isinstance(value, str):
        text = value.strip()
        if not (_INTEGER_RE if integer else _DECIMAL_RE).match(text):
            kind = "a whole number" if integer else "a number"
            why = " (no '_' separators)" if "_" in text else ""
            raise ValueError(f"expected {kind} in decimal{why} (got {_shown(value)})")
        number = int(text) if integer else float(text)
        if not math.isfinite(number):  # 1e999
            raise ValueError(f"expected a finite number (got {_shown(value)})")
        return number
    if integer:
        if not isinstance(value, int):
            raise ValueError(f"expected a whole number (got {_shown(value)})")
        return value
    if not isinstance(value, (int, float)):
        raise ValueError(f"expected a number (got {_shown(value)})")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number (got {value})")
    return float(value)


def seconds_from_env(environ: Any, name: str, default: float, *, most: float = 3600) -> float:
    """Seconds from the environment variable ``name`` of ``environ`` (a mapping): a plain decimal
    number (``parse_number``), more than 0 and at most ``most``; ``default`` when unset or blank.
    Raises ``escha_deploy.utils.errors.BadInput`` (exit 2) naming the variable."""
    from .errors import BadInput

    raw = environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(parse_number(raw))
    except ValueError as e:
        raise BadInput(f"{name}: {e}") from None
    if not 0 < value <= most:
        raise BadInput(f"{name}: expected seconds in (0, {most:g}] (got {raw.strip()!r})")
    return value


def fmt_size_exact(n: int) -> str:
    """Bytes as the shortest exact size string ``parse_size`` reads back: ``12GiB``, ``5.9GB``
    is not exact so ``5900MB``, else ``1406601789B``. (The plan digest is over this form.)"""
    for unit, factor in _EXACT_UNITS:
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


_EXACT_UNITS = (("TiB", 2**40), ("GiB", GiB), ("TB", 10**12), ("GB", GB), ("MiB", MiB),
                ("MB", MB), ("KiB", 2**10), ("KB", 10**3))


def fmt_size_readable(n: int) -> str:
    """Bytes as a size string people read and ``parse_size`` reads back to exactly ``n``: a whole
    unit (``12GiB``), else the shortest exact decimal of one (``1.31GiB`` for 1,406,601,789 B,
    which ``parse_size`` rounds to the byte) when shorter than the bytes (``1073741825B``)."""
    best = fmt_size_exact(n)
    if not best.endswith("B") or best[-2].isalpha():
        return best
    for unit, factor in _EXACT_UNITS:  # largest unit first: a tie keeps it
        for digits in range(1, 10):
            text = f"{n / factor:.{digits}f}".rstrip("0").rstrip(".") + unit
            if n >= factor and parse_size(text) == n:
                if len(text) < len(best):
                    best = text
                break
    return best


def fmt_gb(n: int | float, digits: int = 2) -> str:
    """``10241212416`` -> ``"10.24 GB"`` (GB = 1e9, as SGLang prints host pools)."""
    return f"{n / GB:.{digits}f} GB"


def fmt_gib(n: int | float, digits: int = 2) -> str:
    """``7516192768`` -> ``"7.00 GiB"``."""
    return f"{n / GiB:.{digits}f} GiB"


def fmt_gib_gb(n: int | float, digits: int = 2) -> str:
    """``7516192768`` -> ``"7.00 GiB (7.52 GB)"``: the result of a formula whose terms are in GiB,
    with the GB (1e9) figure after it, the unit SGLang's host-pool messages and flags use."""
    return f"{fmt_gib(n, digits)} ({fmt_gb(n, digits)})"


def fmt_mib(n: int | float, digits: int = 1) -> str:
    return f"{n / MiB:.{digits}f} MiB"


def fmt_bytes(n: int) -> str:
    """Thousands-separated bytes: ``2,580,529,152 B``."""
    return f"{n:,} B"


__all__ = ["GB", "GiB", "MB", "MiB", "parse_size", "size_field", "fmt_gb", "fmt_gib", "fmt_gib_gb", "fmt_mib", "fmt_bytes"]
