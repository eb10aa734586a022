"""Runtime capabilities: what a patch provides and a profile needs.

A capability is provided by a patch in our series (``runtime_patches/``) or by a user overlay
(a fork's INT2 KV patch, say). A profile lists the capabilities it needs; ``serve`` and ``up``
refuse a profile whose needs the runtime lacks, naming them. A capability that adds SGLang
flags (or choices of an existing flag) declares them here, so the argv check can accept them
as *declared*, not verified against the real parser.

The names are shared across issues; change them here only, and ``tests/test_capabilities.py``
checks that every user agrees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

#: Environment variable read by the host-reserve patch: bytes kept free of HiCache host pools.
#: Default when unset: 10 GiB, SGLang 0.5.19's ``HICACHE_HOST_MEMORY_RESERVE_BYTES``
#: (``srt/mem_cache/pool_host/base.py``).
ENV_HOST_RESERVE = "ESCHA_HICACHE_HOST_RESERVE_BYTES"
#: Environment variable read by the host-allocator patch: ``auto``, ``register`` or ``pinned``.
ENV_HOST_ALLOCATOR = "ESCHA_HICACHE_HOST_ALLOCATOR"
HOST_ALLOCATOR_CHOICES = ("auto", "register", "pinned")
#: Environment variable read by the host-mamba-slots patch: the host mamba pool's state count
#: (slots, a whole number >= 1) in place of SGLang's ``int(device slots x --hicache-ratio)``
#: (``srt/mem_cache/pool_host/mamba.py: MambaPoolHost.__init__``); unset = stock.
ENV_HOST_MAMBA_SLOTS = "ESCHA_HICACHE_HOST_MAMBA_SLOTS"

#: Where an image describes its runtime (schema version, SGLang version, base, Python, series,
#: capabilities, inventory digest). Mirrored in OCI labels under ``LABEL_PREFIX``.
RUNTIME_DESCRIPTION_PATH = "/etc/escha/runtime.json"
#: Points this machine's runtime description elsewhere (``runtime_description_path``): a host
#: patched into another folder, and the tests, which never touch /etc/escha.
RUNTIME_DESCRIPTION_ENV = "ESCHA_RUNTIME_DESCRIPTION"


def runtime_description_path() -> str:
    """This machine's runtime description: ``$ESCHA_RUNTIME_DESCRIPTION`` when set, else
    ``RUNTIME_DESCRIPTION_PATH`` (read when called). An image's own path stays
    ``RUNTIME_DESCRIPTION_PATH``: ``up`` reads that one out of the image."""
    import os

    return os.environ.get(RUNTIME_DESCRIPTION_ENV) or RUNTIME_DESCRIPTION_PATH
LABEL_PREFIX = "io.escha."


@dataclass(frozen=True)
class DeclaredFlag:
    """An SGLang flag (or new choices of one) that a capability adds to the parser.

    ``flag`` is the option string (``--kv-cache-dtype``); ``dest`` its argparse dest;
    ``type`` one of ``str``, ``int``, ``float``, ``bool``; ``choices`` the choices it *adds*
    (for an existing flag) or all its choices (for a new one).
    """

    flag: str
    dest: str
    type: Literal["str", "int", "float", "bool"] = "str"
    choices: tuple[str, ...] = ()
    help: str = ""


@dataclass(frozen=True)
class Capability:
    name: str
    source: Literal["series", "overlay"]
    description: str
    env: tuple[str, ...] = ()
    flags: tuple[DeclaredFlag, ...] = ()
    upstream: tuple[str, ...] = field(default=())


CAPABILITIES: dict[str, Capability] = {
    c.name: c
    for c in (
        Capability(
            name="hicache-host-reserve-env",
            source="series",
            description=(
                "HiCache host reserve set by ESCHA_HICACHE_HOST_RESERVE_BYTES (default 10 GiB, "
                "as stock), and host memory read once per TP group before any rank pins"
            ),
            env=(ENV_HOST_RESERVE,),
            upstream=("sglang#38156", "sglang#38157"),
        ),
        Capability(
            name="hicache-host-allocator",
            source="series",
            description=(
                "HiCache host pools from cudaHostRegister (stock) or cudaHostAlloc, chosen by "
                "ESCHA_HICACHE_HOST_ALLOCATOR; auto picks cudaHostAlloc where registered memory "
                "is not device-mappable (WSL2)"
            ),
            env=(ENV_HOST_ALLOCATOR,),
            upstream=("sglang#40232", "sglang#40233", "sglang#7666"),
        ),
        Capability(
            name="transfer-geometry-check",
            source="series",
            description=(
                "refuse to start when a host pool's per-token widths disagree with its device "
                "pool, instead of a later asynchronous illegal memory access"
            ),
        ),
        Capability(
            name="hicache-host-mamba-slots",
            source="series",
            description=(
                "the HiCache host mamba pool sized on its own by ESCHA_HICACHE_HOST_MAMBA_SLOTS "
                "(states per rank; unset = device slots x --hicache-ratio, as stock), so a hybrid "
                "model's prefixes can come back without pinning host KV nobody fills"
            ),
            env=(ENV_HOST_MAMBA_SLOTS,),
            upstream=("sglang#39436",),
        ),
        Capability(
            name="int2-kv",
            source="overlay",
            description="OSCAR INT2 KV cache with a host pool for codes and scales/zeros",
            flags=(
                DeclaredFlag("--kv-cache-dtype", "kv_cache_dtype", "str", ("int2",)),
                DeclaredFlag(
                    "--kv-cache-quant-group-size", "kv_cache_quant_group_size", "int",
                    help="INT2 KV quantization group size (elements along head_dim)",
                ),
            ),
            upstream=("sglang#32129",),
        ),
        Capability(
            name="w2-weights",
            source="overlay",
            description="Escha-W2 2-bit weight quantization layers",
            flags=(DeclaredFlag("--quantization", "quantization", "str", ("escha_w2",)),),
        ),
        Capability(
            name="mamba-mixed-chunk-fix",
            source="overlay",
            description="mixed chunked prefill keeps mamba checkpoints intact on hybrid models",
            upstream=("sglang#39342", "sglang#39526"),
        ),
    )
}

#: A capability a fork declares of its own (``escha-fork.yaml``, ``runtime import``):
#: ``NAMESPACE.NAME`` in lowercase letters, digits and ``-``. Ours never hold a dot, so a fork's
#: cannot shadow them; the namespace ``escha`` is ours, and a NAME that is one of ours is refused
#: (``fork_capability_problem``).
FORK_CAPABILITY = r"^[a-z0-9][a-z0-9-]{0,30}\.[a-z0-9][a-z0-9-]{0,62}$"

OurCapabilityName = Literal[
    "hicache-host-reserve-env",
    "hicache-host-allocator",
    "transfer-geometry-check",
    "hicache-host-mamba-slots",
    "int2-kv",
    "w2-weights",
    "mamba-mixed-chunk-fix",
]


def __getattr__(name: str) -> Any:
    """``CapabilityName`` (a profile's ``runtime.needs``): one of ours (``OurCapabilityName``) or a
    fork's own (``FORK_CAPABILITY``). Made on first use: its pattern is pydantic's, and
    ``runtime verify`` imports this module without pydantic (docs/performance.md)."""
    if name == "CapabilityName":
        from pydantic import AfterValidator, StringConstraints, WithJsonSchema
        from pydantic_core import PydanticCustomError

        ours = ", ".join(repr(c) for c in CAPABILITIES)

        def check(value: str) -> str:
            if value in CAPABILITIES or is_fork_capability(value):
                return value
            raise PydanticCustomError("capability_name", f"Input should be one of {ours}, or a fork's own "
                                      "capability NAMESPACE.NAME (docs/runtime.md, 'A fork on a commit-built parent')")

        # ours as a Literal (profile/keys.py lists them), any other text checked by ``check``: one message
        return Annotated[OurCapabilityName | Annotated[str, StringConstraints(strict=True)], AfterValidator(check), WithJsonSchema(
            {"anyOf": [{"enum": list(CAPABILITIES)}, {"type": "string", "pattern": FORK_CAPABILITY}]})]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_fork_capability(name: str) -> bool:
    """True for a name of the fork's own namespace (``FORK_CAPABILITY``), not one of ours."""
    return name not in CAPABILITIES and fork_capability_problem(name) is None


def fork_capability_problem(name: str) -> str | None:
    """Why ``name`` cannot be a capability a fork commit declares (None: it can: one of our
    overlay capabilities, or one of the fork's own, ``FORK_CAPABILITY``). The message shows
    ``name`` through the terminal filter (a control character as ``\\x1b``)."""
    import re

    from escha_deploy.utils.termtext import printable

    shown = printable(repr(name))
    if any(ord(ch) < 0x20 or 0x7f <= ord(ch) < 0xa0 for ch in name):
        return f"{shown} holds control characters; a capability name is NAMESPACE.NAME in a-z, 0-9 and -"
    if name in SERIES_CAPABILITIES:
        return (f"{shown} comes only from our series ({', '.join(SERIES_CAPABILITIES)}); a fork commit may not "
                "declare it (keep our patch, or drop it and run without that capability)")
    if name in CAPABILITIES:
        return None
    ns, dot, rest = name.partition(".")
    if dot and (ns == "escha" or rest in CAPABILITIES):
        return (f"{shown} collides with escha-deploy's capabilities (the namespace escha, and the names "
                f"{', '.join(CAPABILITIES)}); name the fork's own NAMESPACE.NAME with another name")
    if not dot:
        return (f"unknown capability {shown} (known: {', '.join(x for x in CAPABILITIES if x not in SERIES_CAPABILITIES)}); "
                f"a capability of the fork's own is namespaced, NAMESPACE.NAME (e.g. myfork.{printable(name)[:40]})")
    if re.fullmatch(FORK_CAPABILITY, name) is None:
        return f"{shown}: a fork's own capability is NAMESPACE.NAME, each of a-z, 0-9 and - (at most 31 and 63)"
    return None

#: Capabilities our own series (runtime_patches/series) provides.
SERIES_CAPABILITIES: tuple[str, ...] = tuple(
    n for n, c in CAPABILITIES.items() if c.source == "series"
)


def declared_flags(capabilities: set[str] | frozenset[str] | tuple[str, ...]) -> list[DeclaredFlag]:
    """The flags the given capabilities declare, in registry order."""
    return [f for n, c in CAPABILITIES.items() if n in capabilities for f in c.flags]
