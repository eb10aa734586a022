"""The runtime description: what an image's (or a host's) SGLang is, and what it can do.

Written by ``runtime apply`` to ``/etc/escha/runtime.json`` (``RUNTIME_DESCRIPTION_PATH``);
mirrored in OCI labels under ``io.escha.`` for what is known before the build (``escha-deploy
build`` passes it as build arguments, and ``runtime apply --expect-*`` checks the build agrees).
``serve`` reads the file, ``up`` the labels (falling back to the file in the image); both call
``require_capabilities``. A native ``serve`` with no file treats the runtime as stock, with no
capabilities. ``$ESCHA_RUNTIME_DESCRIPTION`` points a host's description elsewhere: the serving
closure (``scripts/gpu_closure.py install``) writes one of ``kind`` ``closure`` beside its
unpacked tree, listing its ``departures`` from a stock install.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from escha_deploy.sglang.capabilities import LABEL_PREFIX, RUNTIME_DESCRIPTION_PATH
from escha_deploy.utils.errors import BadInput, Refused

if TYPE_CHECKING:
    from escha_deploy.facts.runtime import RuntimeFacts

SCHEMA_VERSION = 1

#: OCI label names (each under ``io.escha.``) and what they hold.
LABEL_SCHEMA = LABEL_PREFIX + "runtime.schema-version"
LABEL_SGLANG = LABEL_PREFIX + "runtime.sglang-version"
LABEL_SERIES = LABEL_PREFIX + "runtime.series"
LABEL_CAPABILITIES = LABEL_PREFIX + "runtime.capabilities"
LABEL_BASE = LABEL_PREFIX + "runtime.base"
LABEL_PYTHON = LABEL_PREFIX + "runtime.python"
#: The escha-deploy installed in the image (``escha_version`` in the description): the
#: CLI that runs ``serve --spec`` there, which may differ from the host's.
LABEL_ESCHA = LABEL_PREFIX + "runtime.escha-version"
#: JSON list of the fork commits applied: ``[{commit, subject, author, date}]`` (UTF-8).
LABEL_FORK = LABEL_PREFIX + "runtime.fork"


class SeriesEntry(BaseModel):
    """One applied patch: file name, ``series``, ``fork`` or ``overlay``, sha256 of its bytes,
    the capabilities its header (or, for a fork commit, the declaration) gives. A fork commit
    also keeps its provenance: commit hash, subject, author, date, and the repository files it
    changed outside ``python/sglang/`` (left out of the image)."""

    # defer_build: `up` imports this module for capabilities_from_labels and builds no model
    model_config = ConfigDict(extra="ignore", defer_build=True)
    name: str
    source: str
    sha256: str
    capabilities: list[str] = Field(default_factory=list)
    commit: str | None = None
    subject: str | None = None
    author: str | None = None
    date: str | None = None
    left_out: list[str] = Field(default_factory=list)


class BuiltBase(BaseModel):
    """An SGLang built from a commit, not a release (docs/runtime.md, "A commit-built base"):
    its ``version`` and ``commit``; ``nearest_release``, whose rules the plan applies
    (``releases.nearest_release``: the version's release prefix); ``lock_digest``/``lock_file``:
    the lock file its tree was checked against at apply (``runtime.lock``; None: its inventory was
    recorded, not pinned beforehand); ``differs``: the files that differ from the nearest
    release's committed inventory (``differs_count`` in all); ``unchecked``: what could not be
    checked for it, each once; ``parser_read``: the lock holds what its own server parser and
    metric names are (``runtime lock --python``), ``parser_differs`` how they differ from the
    nearest release's."""

    model_config = ConfigDict(extra="ignore", defer_build=True)
    version: str
    commit: str | None = None
    nearest_release: str
    lock_digest: str | None = None
    lock_file: str | None = None
    differs: list[str] = Field(default_factory=list)
    differs_count: int = 0
    unchecked: list[str] = Field(default_factory=list)
    parser_read: bool = False
    parser_differs: list[str] = Field(default_factory=list)

    def summary(self) -> str:
        """One line for a plan: what it is, what differs from its nearest release, what was not
        checked."""
        commit = f" (commit {self.commit})" if self.commit else ""
        pin = f"pinned by {self.lock_file} (digest {self.lock_digest[:12]})" if self.lock_digest else \
            "its inventory recorded at apply, not pinned by a lock file"
        differs = (f"{self.differs_count} files differ from {self.nearest_release} "
                   f"({', '.join(self.differs[:3])}{', ...' if self.differs_count > 3 else ''})"
                   if self.differs_count else f"no file differs from {self.nearest_release}'s committed inventory")
        if self.parser_read:
            differs += "; " + ("; ".join(self.parser_differs) if self.parser_differs else
                               f"its parser's flags and its metric names are {self.nearest_release}'s")
        unchecked = "; ".join(self.unchecked)
        return (f"SGLang {self.version}{commit} is built from a commit: planned with the rules of SGLang "
                f"{self.nearest_release}, its nearest release; {pin}; {differs}"
                + (f"; not checked: {unchecked}" if unchecked else ""))


class RuntimeDescription(BaseModel):
    """``/etc/escha/runtime.json``. Lenient on read (unknown keys ignored: stored data, not user
    input)."""

    model_config = ConfigDict(extra="ignore", defer_build=True)
    schema_version: int = SCHEMA_VERSION
    sglang_version: str | None = Field(description="Version: of the installed dist-info")
    base: str = Field(description="wheel:<tag> or image:<ref>, what the series was applied to")
    base_inventory_digest: str = Field(description="inventory digest of the unpatched package")
    base_inventory_committed: bool = Field(
        description="True when the base matched an inventory committed in runtime_patches/base")
    python: str = Field(description="version of SGLang's interpreter, e.g. 3.11.2")
    sglang_dir: str
    series: list[SeriesEntry] = Field(default_factory=list)
    capabilities: list[str] = Field(default_factory=list)
    dropped: list[str] = Field(
        default_factory=list, description="series patches and fork commits the fork's "
        "declaration left out, each with the decision")
    inventory_digest: str = Field(description="digest of the expected patched package inventory")
    kind: Literal["installed", "closure"] = Field(
        default="installed", description="installed: `runtime apply` on an installed SGLang (a host's or an image's); "
        "closure: a trimmed, patched tree packed for a machine without a package index "
        "(scripts/gpu_closure.py), which departs from a stock install as `departures` says")
    departures: list[str] = Field(
        default_factory=list, description="each way this runtime differs from a stock install beyond the series "
        "(a closure's kernel package, stubbed modules, dispatch edits, environment)")
    closure_env: dict[str, str] = Field(
        default_factory=dict, description="environment variables a closure's SGLang runs with")
    built: BuiltBase | None = Field(
        default=None, description="an SGLang built from a commit: its nearest release and what differs from it")
    escha_version: str | None = Field(
        default=None, description="the escha-deploy installed in the image (serve --spec runs it)",
        # images built before the field took the LaunchSpec's name wrote escha_deploy_version
        validation_alias=AliasChoices("escha_version", "escha_deploy_version"))

    def runtime_facts(self, where: str) -> RuntimeFacts:
        """This description as a facts file's ``runtime`` section: the SGLang release and each
        capability, with ``where`` (the file, or ``IMAGE:/etc/escha/runtime.json``) as their
        source (kind ``runtime_description``)."""
        from escha_deploy.facts.provenance import Provenance
        from escha_deploy.facts.runtime import CapabilityFact, RuntimeFacts

        from pydantic import ValidationError

        src = Provenance(kind="runtime_description", where=where)
        release = self.planned_release
        try:
            return RuntimeFacts(
                sglang_release=release, sglang_release_source=src if release else None,
                capabilities=[CapabilityFact(name=c, source=src) for c in dict.fromkeys(self.capabilities)])
        except ValidationError as exc:  # a release that is no x.y.z, a capability name of another shape
            raise BadInput(*(f"{where}: {_description_key(e['loc'])}: {e['msg']}" for e in exc.errors()[:5])) from None

    @property
    def planned_release(self) -> str | None:
        """The release whose rules plan this runtime: its ``sglang_version``, or for one built
        from a commit its nearest release (``built``)."""
        return self.built.nearest_release if self.built is not None else self.sglang_version

    def labels(self) -> dict[str, str]:
        """The OCI labels that mirror this description."""
        return {
            LABEL_SCHEMA: str(self.schema_version),
            LABEL_SGLANG: self.sglang_version or "",
            LABEL_SERIES: ",".join(e.name for e in self.series),
            LABEL_CAPABILITIES: ",".join(self.capabilities),
            LABEL_BASE: self.base,
            LABEL_PYTHON: self.python,
            LABEL_ESCHA: self.escha_version or "",
            LABEL_FORK: fork_label_of(self.series),
        }


def _description_key(loc: tuple[int | str, ...]) -> str:
    """The description's key a ``RuntimeFacts`` error is about (``sglang_release`` is its
    ``sglang_version``; ``capabilities.N.name`` its ``capabilities.N``)."""
    head = {"sglang_release": "sglang_version"}.get(str(loc[0]), str(loc[0])) if loc else "runtime"
    return ".".join([head, *(str(x) for x in loc[1:2])])


def fork_label_of(series: list[SeriesEntry]) -> str:
    """The ``io.escha.runtime.fork`` value for these entries (``""`` without fork commits)."""
    items = [{"commit": e.commit, "subject": e.subject, "author": e.author, "date": e.date}
             for e in series if e.source == "fork"]
    return json.dumps(items, ensure_ascii=False, separators=(",", ":")) if items else ""


def read_description(path: str | Path | None = None) -> RuntimeDescription | None:
    """The description at ``path`` (default ``capabilities.runtime_description_path()``, read
    when called); ``None`` when there is none (a stock runtime). Raises ``BadInput`` naming the file
    when it exists but does not parse."""
    from escha_deploy.sglang import capabilities

    from escha_deploy.utils.jsonio import loads_json, read_regular

    p = Path(path if path is not None else capabilities.runtime_description_path())
    raw = read_regular(p, "the runtime description", missing_ok=True)
    if raw is None:
        return None
    data = loads_json(raw, p, "the runtime description")
    try:
        return RuntimeDescription.model_validate(data)
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        raise BadInput(f"{p}: not a runtime description ({first})") from None


def write_description(desc: RuntimeDescription, path: str | Path = RUNTIME_DESCRIPTION_PATH) -> None:
    """Write atomically (temp file, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(desc.model_dump_json(indent=2) + "\n")
    tmp.replace(p)


def capabilities_from_labels(labels: dict[str, str] | None) -> list[str] | None:
    """The capabilities an image's labels declare; ``None`` when the label is absent or empty
    (then read the file from the image: a plain `docker build` leaves the label empty)."""
    if not labels or not labels.get(LABEL_CAPABILITIES):
        return None
    return [c for c in labels[LABEL_CAPABILITIES].split(",") if c]


def fork_capabilities(names: list[str] | tuple[str, ...]) -> list[str]:
    """Those of ``names`` that escha-deploy's patch series does not provide: a fork's commits
    (``runtime import``) or overlay patches bring them (``capabilities.CAPABILITIES`` marks
    them ``overlay``; a name it does not know is one a fork declares)."""
    from escha_deploy.sglang.capabilities import SERIES_CAPABILITIES

    return [c for c in names if c not in SERIES_CAPABILITIES]


def capability_hint(missing: list[str] | tuple[str, ...], *, native: bool | None = False) -> str:
    """How a runtime gets the capabilities ``missing`` (docs/runtime.md): the series' by an image
    built with it (``build --hicache``) or, natively, ``runtime apply``; a fork's
    (``fork_capabilities``) only with the fork's commits imported (``runtime import``) and
    built in (``build --fork-dir``) or applied (``runtime apply --fork-dir``), or as overlay
    patches. ``native``: True for a native install, False for an image, None when either may be
    (both routes named: a native ``serve``, which an image could run instead, or a ``plan`` of a
    runtime description that ``runtime apply`` or an image build wrote)."""
    from escha_deploy.sglang.releases import series_release

    fork = fork_capabilities(missing)
    if not fork:
        lead, doc = "", "(docs/runtime.md)"
        image = "build the image with escha-deploy's patch series: `escha-deploy build --hicache`"
        here = "patch the installed SGLang with " + ("it" if native is None else "escha-deploy's patch series") + (
            ": `escha-deploy runtime apply`")
    else:
        lead = (f"{', '.join(fork)} {'is a fork capability' if len(fork) == 1 else 'are fork capabilities'}, which "
                f"escha-deploy's patch series does not provide (stock SGLang {series_release()} has none): import the "
                f"fork's commits (git format-patch v{series_release()}..BRANCH -o DIR, declared in DIR/escha-fork.yaml) "
                "with `escha-deploy runtime import DIR` (into runtime_fork/), then ")
        doc = '(or overlay patches: runtime_overlays/, --overlay-dir; docs/runtime.md, "Bring your fork")'
        image = "build the image with them: `escha-deploy build --hicache --fork-dir runtime_fork`"
        here = "apply them to the installed SGLang: `escha-deploy runtime apply --fork-dir runtime_fork`"
    routes = f"{image} for an image, or natively {here}" if native is None else here if native else image
    return f"{lead}{routes} {doc}"


def require_capabilities(have: list[str] | None, needed: list[str] | tuple[str, ...],
                         where: str, *, native: bool | None = False) -> None:
    """Raise ``Refused`` naming each capability in ``needed`` that ``have`` lacks, with the hint
    of how to bring them in (``capability_hint``; ``native`` as there).

    ``have=None`` means a stock runtime (no description): nothing is provided. ``where`` names
    the runtime (an image reference or the description path) in the message.
    """
    missing = [c for c in needed if c not in (have or [])]
    if missing:
        raise Refused(*[f"{where}: runtime lacks capability {c!r}" for c in missing],
                      hint=capability_hint(missing, native=native))
