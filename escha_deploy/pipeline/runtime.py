"""The runtime a plan is made for, chosen once (``resolve_runtime``): its SGLang release and
capabilities, from a runtime source and the gathered facts; ``runtime_here``: this machine's
runtime description."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from escha_deploy.facts.provenance import FactSource, ProvenanceKind
from escha_deploy.pipeline.sources import BoxRuntime, DescribedHost, FactsFileHost, RuntimeClaim, RuntimeSource, ThisHost

if TYPE_CHECKING:
    from escha_deploy.pipeline.gathering import Gathered
    from escha_deploy.facts.runtime import RuntimeFacts
    from escha_deploy.profile import Profile
    from escha_deploy.sglang.releases import ReleaseChoice
    from escha_deploy.runtime.description import RuntimeDescription


class Runtime(NamedTuple):
    """The runtime a plan is made for, chosen once (``resolve_runtime``).

    ``release``: the ``releases.ReleaseChoice`` (version, where it came from); ``capabilities``:
    the runtime's (``None``: the profile's needs, as an image built for it provides);
    ``where``: where those capabilities were read (stated on the launch spec's sources, with
    ``kind``; ``None``: not stated); ``facts``: the plan's fact sources the runtime adds (a facts
    file's runtime section: its release and capabilities); ``binding``: ``(capabilities,
    where)`` whose lack of a capability the profile needs is refused (exit 3: this machine's
    description, a facts file's section that lists them), ``None`` when the needs were assumed;
    ``notes``: warnings the plan carries (a stale or ignored runtime description); ``described``:
    the runtime as a facts file's ``runtime`` section writes it (``plan --write-facts``;
    ``None``: not known)."""

    release: ReleaseChoice
    capabilities: frozenset[str] | None = None
    where: str | None = None
    kind: ProvenanceKind = "profile"
    facts: tuple[FactSource, ...] = ()
    binding: tuple[tuple[str, ...], str] | None = None
    notes: tuple[str, ...] = ()
    described: RuntimeFacts | None = None

    def lacking(self, profile: Profile) -> list[str]:
        """``where: runtime lacks capability 'c'`` for each capability ``profile`` needs that
        the binding runtime lacks (``runtime.description.require_capabilities``); ``[]`` when
        none lacks or the needs were assumed."""
        if self.binding is None:
            return []
        from escha_deploy.utils.errors import Refused
        from escha_deploy.runtime.description import require_capabilities

        try:
            require_capabilities(list(self.binding[0]), tuple(profile.runtime.needs), self.binding[1])
        except Refused as exc:
            return list(exc.problems)
        return []


def resolve_runtime(profile: Profile, g: Gathered | None, source: RuntimeSource) -> Runtime:
    """The one place a runtime is chosen: its SGLang release (``releases.choose_release``: a
    runtime's own release, else ``--sglang-version``, else the profile's, else the default; two
    that differ are refused, exit 3, naming both) and capabilities, from ``source``
    (``ProfileTarget``, ``RuntimeClaim``, ``BoxRuntime``) and the gathered facts (a facts file's
    runtime section; ``None``: no facts, ``compose`` without ``--facts``). Raises ``BadInput``
    (exit 2) for a release that is not supported."""
    from escha_deploy.sglang.releases import ReleaseChoice, check_supported, choose_release

    claim: tuple[str | None, str] | None = None
    caps: frozenset[str] | None = None
    facts: list[FactSource] = []
    binding: tuple[tuple[str, ...], str] | None = None
    notes: list[str] = []
    desc: RuntimeDescription | None = None
    box: RuntimeFacts | None = None
    if isinstance(source, RuntimeClaim):
        claim = (source.release, source.release_where)
        caps = None if source.capabilities is None else frozenset(source.capabilities)
    elif isinstance(source, BoxRuntime):
        desc = runtime_here(notes) if source.here else None
        if desc is not None and g is not None and not isinstance(g.source, ThisHost):
            # a described box is another box: planned with its facts file's runtime or the
            # profile's needs, never this machine's description
            from escha_deploy.sglang import capabilities as capmod

            described = (g.source.named if isinstance(g.source, FactsFileHost) else
                         (g.source.origin or "--host-ram") if isinstance(g.source, DescribedHost) else "the facts")
            notes.append(f"{described} describes another box: planned with the profile's runtime.needs (the "
                         f"image built for it) or its facts file's runtime, not this machine's runtime description "
                         f"({capmod.runtime_description_path()})")
            desc = None
        box = g.runtime if g is not None and desc is None else None
        if desc is not None:
            from escha_deploy.sglang.capabilities import runtime_description_path

            claim = (desc.sglang_version, f"this runtime ({runtime_description_path()})")
            caps = frozenset(desc.capabilities)
            binding = (tuple(desc.capabilities), claim[1])
        elif box is not None and g is not None:
            if box.sglang_release is not None:
                claim = (box.sglang_release, f"{g.runtime_where}.sglang_release ({box.release_claim()[1]})")
                facts.append(FactSource(fact="SGLang release", value=box.sglang_release,
                                        source=f"{g.runtime_where}.sglang_release", kind="facts_file"))
            if (names := box.capability_names()) is not None:
                caps = frozenset(names)
                facts.append(FactSource(fact="capabilities", value=", ".join(sorted(names)) or "none",
                                        source=f"{g.runtime_where}.capabilities", kind="facts_file"))
                binding = (tuple(sorted(names)), f"{g.runtime_where}.capabilities")
    flag = source.flag if isinstance(source, BoxRuntime) else None
    if isinstance(source, BoxRuntime) and source.release is not None:  # plan --compare A: A, whatever is named
        release = ReleaseChoice(version=check_supported(*source.release), source=source.release[1])
    else:
        release = choose_release(image=claim, flag=flag, profile=profile.runtime.sglang_version)
    if release.built is not None:  # said once, in the plan's notes
        if desc is None and isinstance(source, RuntimeClaim) and source.release_where.startswith("this runtime ("):
            desc = runtime_here()  # native serve: the claim is this machine's description's
        notes.append(built_note(release, desc))
    if isinstance(source, RuntimeClaim):
        return Runtime(release=release, capabilities=caps, where=source.where, kind=source.kind, notes=tuple(notes))
    return Runtime(release=release, capabilities=caps, facts=tuple(facts), binding=binding, notes=tuple(notes),
                   described=(box or _described_runtime(desc, release.version if flag else None)) if isinstance(source, BoxRuntime) else None)


def built_note(release: ReleaseChoice, desc: RuntimeDescription | None) -> str:
    """The plan's one line on a runtime built from a commit (``release.built``): its description's
    account (``BuiltBase.summary``: the nearest release, the lock, what differs, what was not
    checked) when this machine's description is of it, else the rule alone and what it leaves
    unchecked."""
    if desc is not None and desc.built is not None and desc.built.version == release.built:
        return desc.built.summary()
    from escha_deploy.sglang.releases import BUILT_DOC

    return (f"SGLang {release.built} is built from a commit: planned with the rules of SGLang {release.version}, "
            f"its nearest release ({BUILT_DOC}); not checked: what differs from {release.version} (no "
            "runtime description of it read here: `escha-deploy runtime describe` in its image says)")


def runtime_here(notes: list[str] | None = None) -> RuntimeDescription | None:
    """This machine's runtime description (``capabilities.runtime_description_path()``:
    $ESCHA_RUNTIME_DESCRIPTION, else /etc/escha/runtime.json, written by ``runtime apply``), or
    ``None`` for none; ``runtime.description.read_description``, whose models are imported only
    when the file is there. A stale one (its ``sglang_dir`` no longer exists: that SGLang was
    removed or replaced) is ignored, with a line appended to ``notes`` naming it."""
    from escha_deploy.sglang import capabilities as caps

    path = caps.runtime_description_path()
    if not Path(path).is_file():
        return None
    from escha_deploy.runtime.description import read_description

    desc = read_description(path)
    if desc is not None and not Path(desc.sglang_dir).is_dir():
        if notes is not None:
            notes.append(f"{path}: stale runtime description (its sglang_dir {desc.sglang_dir} no longer exists): "
                         "ignored; planned with the profile's runtime.needs")
        return None
    return desc


def _described_runtime(desc: RuntimeDescription | None, sglang_version: str | None) -> RuntimeFacts | None:
    """The runtime a plan with no facts-file runtime describes, as a facts file's ``runtime``
    section: this machine's runtime description, else ``--sglang-version`` (the release alone;
    capabilities not known), else ``None`` (not known: no section written)."""
    if desc is not None:
        from escha_deploy.sglang.capabilities import runtime_description_path

        return desc.runtime_facts(str(runtime_description_path()))
    if sglang_version is None:
        return None
    from escha_deploy.facts.provenance import Provenance
    from escha_deploy.facts.runtime import RuntimeFacts

    return RuntimeFacts(sglang_release=sglang_version,
                        sglang_release_source=Provenance(kind="command_line", where="--sglang-version"))
