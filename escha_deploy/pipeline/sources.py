"""Where a plan's inputs come from: one small typed value per kind of source. Facts sources:
``ThisHost``, ``DescribedHost``, ``FactsFileHost``, ``InContainer`` (``facts_source`` turns a
command's options into one); runtime sources: ``ProfileTarget``, ``RuntimeClaim``,
``BoxRuntime``."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from escha_deploy.utils.errors import BadInput
from escha_deploy.facts.provenance import ProvenanceKind

if TYPE_CHECKING:
    from escha_deploy.facts.host import Platform


class ThisHost(NamedTuple):
    """This machine, read now (/proc/meminfo, the cgroup files, NVML). ``findings``: with
    doctor's saved findings for this machine (pinned ceiling, allocator, last prefill);
    ``doctor`` plans without them, so that a ceiling once seen can be measured again.
    ``platform``: ``--wsl2``/``--linux`` (default detected). ``server_here``: the server runs
    here, so the file L3 directory is checked here (``folders.check_l3_dir``; ``doctor`` does
    not)."""

    findings: bool = True
    platform: Platform | None = None
    server_here: bool = True


class DescribedHost(NamedTuple):
    """A host described in words, not read (``--host-ram``, a fleet box's ``host_ram``):
    ``mem_total_bytes`` (bytes) and ``platform`` (``None``: not said, planned as Linux);
    ``origin`` where the memory was written
    (``None``: ``--host-ram``; ``fleet``: the fleet file's ``host_ram`` line). Doctor's findings
    describe this machine, so they are never read; its L3 directory is not this machine's."""

    mem_total_bytes: int
    platform: Platform | None = None
    origin: str | None = None


class FactsFileHost(NamedTuple):
    """A facts file (``--facts``, ``$ESCHA_FACTS``, a fleet box's ``facts``): the host, the GPU
    records, doctor's findings and the runtime section come from it; of this machine only the
    model folder and the L3 directory's free space are read. ``named``: how the file is named in
    messages (``--facts`` or ``ESCHA_FACTS=PATH``); ``what``/``hint``: its reader's wording
    (``fleet``: a box's saved facts); ``platform``: ``--wsl2``/``--linux`` over the file's;
    ``server_here``: the server runs here (``up --facts``, ``serve --facts``): the L3
    directory is checked here."""

    path: str
    named: str = "--facts"
    what: str = "the facts file"
    hint: str | None = None
    platform: Platform | None = None
    server_here: bool = False


class InContainer(NamedTuple):
    """Inside the server's container (``serve`` with ``ESCHA_SERVE_MODE=container``): the host
    facts come from ``facts`` (this machine or a facts file named by ``ESCHA_FACTS``), the model
    folder is read at ``model.path``, the draft's at ``model.draft.path`` and the L3 directory
    at ``flags.CONTAINER_L3_DIR``, where the container mounts them."""

    facts: ThisHost | FactsFileHost = ThisHost()


FactsSource = ThisHost | DescribedHost | FactsFileHost | InContainer


def facts_source(facts_path: str | None = None, *, host_ram: int | None = None, platform: Platform | None = None,
                 launch: bool = False) -> FactsSource:
    """The facts source a command's options name: ``facts_path`` (``--facts``; else
    ``$ESCHA_FACTS`` when set, ``paths.facts_file``), else ``host_ram`` (``--host-ram``, bytes),
    else this machine. The file L3 directory is checked here for a plan of this machine, and,
    with ``launch`` (``up``, ``serve``: the server runs here), whatever describes the host.
    Raises ``BadInput`` (exit 2) for a facts file and ``--host-ram`` together."""
    from escha_deploy.utils.paths import facts_file

    path, named = facts_file(facts_path)
    if path and host_ram is not None:
        raise BadInput(f"{named} and --host-ram are mutually exclusive (the facts file describes the host)")
    if path:
        return FactsFileHost(path, named=named, platform=platform, server_here=launch)
    if host_ram is not None:
        return DescribedHost(host_ram, platform)
    return ThisHost(platform=platform)


class ProfileTarget(NamedTuple):
    """The runtime the profile asks for, as an image built for it provides: the profile's
    ``runtime.needs`` (assumed, so never refused for lacking one) and its
    ``runtime.sglang_version``, else the default release (``compose --facts``, ``doctor``)."""


class RuntimeClaim(NamedTuple):
    """What a runtime that will run the server says of itself: an image's labels or runtime
    description file (``up``, ``launch.prepare.image_runtime``) or this runtime's description
    (``serve``). ``release``: its SGLang release (``None``: it does not say), named in
    messages as ``release_where``; ``capabilities``: what it provides (``None``: the profile's
    needs, assumed), stated on the launch spec as coming from ``where`` (``kind``: the kind of
    source: ``image_labels``, ``runtime_description``, ``default``...). A release the profile
    names that differs from ``release`` is refused (exit 3, both named)."""

    release: str | None
    release_where: str
    capabilities: tuple[str, ...] | None
    where: str | None = None
    kind: ProvenanceKind = "profile"


class BoxRuntime(NamedTuple):
    """The runtime of the box planned, as ``plan`` and ``fleet plan`` find it: this machine's
    runtime description (``runtime_here``) when the facts are this machine's and ``here``, else
    the facts file's ``runtime`` section (``Gathered.runtime``), else the profile's needs.
    ``flag``: ``--sglang-version``; ``release``: ``(version, where)`` planned whatever the
    profile or runtime says (``plan --compare A``). ``here=False``: never read this machine's
    description (``fleet plan``: a box is another machine)."""

    flag: str | None = None
    release: tuple[str, str] | None = None
    here: bool = True


RuntimeSource = ProfileTarget | RuntimeClaim | BoxRuntime
