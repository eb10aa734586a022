"""The fleet file: boxes, replica groups and the router, validated like a profile.

A fleet file is YAML. ``load_fleet(path)`` reads it with source positions (``yamlpos``),
validates it once with pydantic, then checks what refers to what (group members are known
boxes, the router's box exists, ...). Every problem becomes one line ``file:line: dotted.key:
message``, all of them, sorted by line, raised as one ``BadInput`` (exit 2), the same error
style as profiles (``profile.load_profile``).

Paths inside the file (``profile``, ``facts``, ``api_key_file``) are relative to the fleet
file's folder. Example (``docs/scale-out.md`` has the full reference)::

    name: lab
    boxes:
      - {name: wsl-a, address: 192.168.1.20, profile: rtx5060ti-tp2-fp8, facts: wsl-a.json}
      - {name: lin-b, address: 192.168.1.21, profile: linux-tp2-l3, host_ram: 64GiB, platform: linux}
    groups:
      - {name: chat, boxes: [wsl-a, lin-b]}
    router: {box: lin-b, api_key_file: router.key}

How to add a field: add it to the section model below with a ``Field(description=...)`` that
gives the unit, the default and the SMG or SGLang flag it feeds; render it in ``router.py`` or
``multinode.py`` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, StrictInt, ValidationError

from ..utils.errors import BadInput
from ..utils.jsonio import file_problem
from ..utils.netaddr import HostAddress, host_port
from ..profile import MAX_SECONDS, MAX_TOKENS, EschaModel, Number, Size
from ..utils.yamlpos import Positions, format_validation_errors, load_yaml_with_positions, position_of

#: A name that is also a DNS-1123 label: Kubernetes object names, compose service names and
#: container names are built from it (kubernetes.io/docs/concepts/overview/working-with-objects/names).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"
#: A DNS-1123 subdomain: what Kubernetes requires of a Secret, PersistentVolumeClaim and
#: RuntimeClass name (at most 253 characters; lowercase letters, digits, '-' and '.', starting
#: and ending with a letter or digit; same page).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

#: SMG 1.13's routing policies (``smg launch --policy``; lightseekorg/smg
#: ``model_gateway/src/main.rs``).
RouterPolicy = Literal["cache_aware", "round_robin", "random", "power_of_two", "least_load",
                       "prefix_hash", "consistent_hashing", "manual", "bucket"]

#: The SMG image ``escha-deploy fleet build-router`` builds from the ``smg`` wheel (no registry
#: is needed; ``lightseekorg/smg`` is the upstream image of the same binary).
SMG_VERSION = "1.13.0"
IMAGE_SMG = f"escha-smg:{SMG_VERSION}"


class Box(EschaModel):
    """One machine: where it is, what it serves, and what is known about it."""

    name: Annotated[str, Field(pattern=DNS_LABEL, description="box name (a DNS label: a-z, 0-9, -; at most 40)")]
    address: Annotated[
        HostAddress,
        Field(description="host name, IPv4 or IPv6 address (bare, no port) the router and peer nodes reach it at; "
              "bracketed wherever it is joined with a port (netaddr.host_port)"),
    ]
    profile: Annotated[str, Field(description="profile name or path (relative to the fleet file)")]
    set: Annotated[list[str], Field(description="profile overrides, as `--set KEY=VALUE`")] = []
    facts: Annotated[
        str | None,
        Field(description="saved doctor report of this box (`escha-deploy doctor --profile P --format "
              "json > FILE` run on the box): platform, memory, WSL networking mode, image digest"),
    ] = None
    host_ram: Annotated[
        Size | None, Field(description="MemTotal of the box when no facts are saved (as plan --host-ram)")
    ] = None
    platform: Annotated[
        Literal["linux", "wsl2"] | None, Field(description="platform when no facts are saved (default linux)")
    ] = None
    nic: Annotated[
        str | None,
        Field(description="network interface peers reach this box on (NCCL_SOCKET_IFNAME and "
              "GLOO_SOCKET_IFNAME of a multi-node instance), e.g. eth0"),
    ] = None


#: Nodes of one instance: far above any fleet of small boxes (SGLang's --nnodes has no bound of its
#: own), low enough that a typo is refused at the key.
MAX_NODES = 1024
#: Consecutive health-check answers counted (SMG's --health-*-threshold): a day of 1 s checks.
MAX_CHECKS = 86_400
#: --balance-rel-threshold: a load ratio between workers; above this, balancing never triggers.
MAX_REL_THRESHOLD = 1e6


class Group(EschaModel):
    """Instances of one model: with ``nodes: 1`` every box is an independent replica; with
    ``nodes: N`` each run of N consecutive boxes is one instance spanning N nodes (node rank =
    position in the run; rank 0 serves HTTP)."""

    name: Annotated[str, Field(pattern=DNS_LABEL, description="group name (a DNS label)")]
    boxes: Annotated[list[str], Field(min_length=1, description="box names, in node-rank order")]
    nodes: Annotated[StrictInt, Field(ge=1, le=MAX_NODES, description="nodes per instance (--nnodes); 1: replicas")] = 1
    parallel: Annotated[
        Literal["pp", "tp"],
        Field(description="across nodes: pp (--pp-size = nodes, TP inside a node; cross-node traffic only at "
              "stage boundaries) or tp (--tp-size = nodes x GPUs per node)"),
    ] = "pp"
    dist_init_port: Annotated[
        StrictInt, Field(gt=0, lt=65536, description="rank 0's torch.distributed rendezvous port (--dist-init-addr HOST:PORT)")
    ] = 20000
    dist_timeout_s: Annotated[
        StrictInt | None, Field(gt=0, le=MAX_SECONDS, description="--dist-timeout (seconds) for the rendezvous")
    ] = None


class RouterHealth(EschaModel):
    """SMG's worker health checks (``smg launch --health-*``; defaults are SMG 1.13's)."""

    endpoint: Annotated[str, Field(description="--health-check-endpoint")] = "/health"
    interval_s: Annotated[StrictInt, Field(gt=0, le=MAX_SECONDS, description="--health-check-interval-secs (SMG default 60)")] = 60
    timeout_s: Annotated[
        StrictInt, Field(gt=0, le=MAX_SECONDS, description="--health-check-timeout-secs (SMG default 5); SGLang's /health runs a "
                   "1-token generation with its own 20 s timeout (SGLANG_HEALTH_CHECK_TIMEOUT)")
    ] = 25
    failure_threshold: Annotated[StrictInt, Field(gt=0, le=MAX_CHECKS, description="--health-failure-threshold (SMG default 3)")] = 3
    success_threshold: Annotated[StrictInt, Field(gt=0, le=MAX_CHECKS, description="--health-success-threshold (SMG default 2)")] = 2
    worker_startup_timeout_s: Annotated[
        StrictInt | None,
        Field(gt=0, le=MAX_SECONDS, description="--worker-startup-timeout-secs; default: the longest container.ready_timeout_s "
              "of the workers' profiles (a model load), at least SMG's 1800"),
    ] = None
    worker_startup_check_interval_s: Annotated[
        StrictInt, Field(gt=0, le=MAX_SECONDS, description="--worker-startup-check-interval (seconds; SMG default 30)")
    ] = 10


class Router(EschaModel):
    """SGLang's router, SMG (PyPI ``smg``), in front of every single-node replica and every
    multi-node instance's rank 0."""

    box: Annotated[str, Field(description="the box that runs the router (its compose file gets the service)")]
    port: Annotated[StrictInt, Field(gt=0, lt=65536, description="router HTTP port (--port)")] = 30080
    expose: Annotated[
        bool, Field(description="listen on 0.0.0.0 instead of 127.0.0.1 (needs api_key_file)")
    ] = False
    policy: Annotated[RouterPolicy, Field(description="--policy")] = "cache_aware"
    cache_threshold: Annotated[
        Number, Field(ge=0, le=1, description="--cache-threshold: prefix match ratio that routes to the matching worker")
    ] = 0.3
    balance_abs_threshold: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS, description="--balance-abs-threshold (requests)")] = 64
    balance_rel_threshold: Annotated[Number, Field(ge=1, le=MAX_REL_THRESHOLD, description="--balance-rel-threshold")] = 1.5
    api_key_file: Annotated[
        str | None, Field(description="file holding the clients' API key (and the workers' when they have one)")
    ] = None
    metrics_port: Annotated[StrictInt, Field(gt=0, lt=65536, description="--prometheus-port")] = 29000
    health: RouterHealth = RouterHealth()
    run: Annotated[
        Literal["container", "native"],
        Field(description="container: the image below through docker-py; native: the `smg` binary on PATH"),
    ] = "container"
    image: Annotated[str, Field(description="SMG image (built locally from the smg wheel)")] = IMAGE_SMG


class Kubernetes(EschaModel):
    """What `fleet render k8s` needs beyond the boxes' profiles."""

    namespace: Annotated[str, Field(pattern=DNS_LABEL, description="namespace of every object")] = "default"
    runtime_class: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253,
                                               description="runtimeClassName of server pods (e.g. nvidia)")] = None
    model_pvc: Annotated[
        str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253, description="PersistentVolumeClaim holding the model folder "
                          "(mounted read-only at model.path); none: a hostPath at model.host_dir")
    ] = None
    api_key_secret: Annotated[
        str, Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Secret (key `api-key`) with the router's and workers' API key")
    ] = "escha-api-key"
    hf_token_secret: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253,
                                                 description="Secret (key `token`) with the HF token")] = None


class Fleet(EschaModel):
    """A fleet: boxes, groups of instances on them, the router, Kubernetes settings."""

    name: Annotated[str, Field(pattern=DNS_LABEL, description="fleet name (a DNS label)")]
    boxes: Annotated[list[Box], Field(min_length=1, description="the machines")]
    groups: Annotated[
        list[Group], Field(description="instances; default one replica group of every box")
    ] = []
    router: Router | None = None
    kubernetes: Kubernetes = Kubernetes()

    def box(self, name: str) -> Box:
        """The box called ``name``; ``BadInput`` naming the known boxes otherwise."""
        for b in self.boxes:
            if b.name == name:
                return b
        raise BadInput(f"unknown box {name!r}: the fleet has {', '.join(b.name for b in self.boxes)}")

    def effective_groups(self) -> list[Group]:
        """``groups``, or one replica group ``replicas`` of every box when none is given."""
        return list(self.groups) or [Group(name="replicas", boxes=[b.name for b in self.boxes])]

    def instances(self) -> list["Instance"]:
        """Every model instance: its group, index and boxes in node-rank order."""
        out = []
        for g in self.effective_groups():
            for i in range(0, len(g.boxes), g.nodes):
                out.append(Instance(group=g, index=i // g.nodes, boxes=g.boxes[i:i + g.nodes]))
        return out


class Instance(EschaModel):
    """One model instance: ``boxes[0]`` is node rank 0 (serves HTTP)."""

    group: Group
    index: int
    boxes: list[str]

    @property
    def name(self) -> str:
        return f"{self.group.name}-{self.index}"

    @property
    def multi_node(self) -> bool:
        return len(self.boxes) > 1


class LoadedFleet(EschaModel):
    """A validated fleet and the file it came from (paths inside resolve against its folder)."""

    fleet: Fleet
    path: str
    _profiles: dict = PrivateAttr(default_factory=dict)
    _positions: dict = PrivateAttr(default_factory=dict)

    def where(self, box: Box, key: str) -> str:
        """Where the fleet file sets ``key`` of box ``box``: ``FILE:LINE boxes.NAME.KEY`` (the
        line when known), for messages that name a number's source."""
        i = next((i for i, b in enumerate(self.fleet.boxes) if b.name == box.name), None)
        at = position_of(self._positions, ("boxes", i, key)) if i is not None else None
        return f"{at[0]}:{at[1]} boxes.{box.name}.{key}" if at else f"{self.path} boxes.{box.name}.{key}"

    def profile(self, box: Box):
        """The box's validated profile with its ``set`` overrides (``profile.Profile``), as
        ``load_fleet`` loaded it (loaded now when this fleet was built otherwise)."""
        if box.name not in self._profiles:
            from ..profile import load_profile

            self._profiles[box.name] = load_profile(self.profile_ref(box), box.set)
        return self._profiles[box.name]

    def resolve(self, ref: str) -> Path:
        """A path written in the fleet file, made absolute against the file's folder."""
        p = Path(ref).expanduser()
        return p if p.is_absolute() else Path(self.path).parent / p

    def profile_ref(self, box: Box) -> str:
        """The box's profile as ``load_profile`` takes it: a shipped name, or a resolved path."""
        return _profile_ref(box.profile, Path(self.path).parent)


def _profile_ref(ref: str, base: Path) -> str:
    """A box's ``profile`` as ``load_profile`` takes it: a shipped name, or a path resolved
    against the fleet file's folder ``base``."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        p = Path(ref).expanduser()
        return str(p if p.is_absolute() else base / p)
    return ref


def _file_line(f: Path, problem: str) -> str:
    """``no such file: F`` when it is missing, else ``F: cannot read: REASON`` (a FIFO, a
    device, a folder, a file this user may not read)."""
    import errno
    import os

    return f"no such file: {f}" if problem == os.strerror(errno.ENOENT) else f"{f}: cannot read: {problem}"


def _line(pos: Positions, origin: str, loc: tuple, message: str) -> tuple[int, str]:
    where = position_of(pos, loc)
    file, line = where if where else (origin, 0)
    dotted = ".".join(str(p) for p in loc)
    return line, f"{file}:{line}: {dotted}: {message}" if line else f"{file}: {dotted}: {message}"


def _cross_check(fleet: Fleet, pos: Positions, origin: str, base: Path) -> list[tuple[int, str]]:
    """What pydantic cannot see field by field: references between sections and files."""
    out: list[tuple[int, str]] = []
    names = [b.name for b in fleet.boxes]
    seen: set[str] = set()
    for i, b in enumerate(fleet.boxes):
        if b.name in seen:
            out.append(_line(pos, origin, ("boxes", i, "name"), f"box {b.name!r} is defined twice"))
        seen.add(b.name)
        if b.facts is None and b.host_ram is None:
            out.append(_line(pos, origin, ("boxes", i),
                             "give facts (a saved doctor report) or host_ram (and platform)"))
        if b.facts is not None and (b.host_ram is not None or b.platform is not None):
            out.append(_line(pos, origin, ("boxes", i, "facts"),
                             "facts and host_ram/platform are mutually exclusive (the facts say both)"))
        if b.facts is not None:
            f = Path(b.facts).expanduser()
            f = f if f.is_absolute() else base / f
            problem = file_problem(f)
            if problem is not None:
                out.append(_line(pos, origin, ("boxes", i, "facts"), _file_line(f, problem)))
    member: dict[str, str] = {}
    group_names: set[str] = set()
    for gi, g in enumerate(fleet.groups):
        if g.name in group_names:
            out.append(_line(pos, origin, ("groups", gi, "name"), f"group {g.name!r} is defined twice"))
        group_names.add(g.name)
        for bi, name in enumerate(g.boxes):
            if name not in names:
                out.append(_line(pos, origin, ("groups", gi, "boxes", bi),
                                 f"unknown box {name!r} (boxes: {', '.join(names)})"))
            elif name in member:
                out.append(_line(pos, origin, ("groups", gi, "boxes", bi),
                                 f"box {name!r} is already in group {member[name]!r}: one server per box"))
            else:
                member[name] = g.name
        if len(g.boxes) % g.nodes:
            out.append(_line(pos, origin, ("groups", gi, "nodes"),
                             f"{len(g.boxes)} boxes do not split into instances of {g.nodes} nodes"))
    r = fleet.router
    if r is not None:
        if r.box not in names:
            out.append(_line(pos, origin, ("router", "box"), f"unknown box {r.box!r} (boxes: {', '.join(names)})"))
        if r.expose and not r.api_key_file:
            out.append(_line(pos, origin, ("router", "expose"), "listening beyond 127.0.0.1 needs api_key_file"))
        if r.port == r.metrics_port:
            out.append(_line(pos, origin, ("router", "metrics_port"), f"same as router.port ({r.port})"))
        if r.api_key_file:
            f = Path(r.api_key_file).expanduser()
            f = f if f.is_absolute() else base / f
            problem = file_problem(f)
            if problem is not None:
                out.append(_line(pos, origin, ("router", "api_key_file"), _file_line(f, problem)))
    return out


def _profile_problems(data: dict, pos: Positions, origin: str, base: Path) -> tuple[list[tuple[int, str]], dict]:
    """Load every box's profile with its ``set`` from the raw file data, whatever else is wrong
    with the file, so a bad profile is reported with the other problems. Returns the problems
    (``file:line: boxes.N.profile: ...``, or ``boxes.N.set.M`` for a bad override) and
    ``{box name: Profile}`` of the boxes that loaded."""
    from ..profile import load_profile

    out: list[tuple[int, str]] = []
    loaded: dict = {}
    boxes = data.get("boxes")
    for i, b in enumerate(boxes if isinstance(boxes, list) else []):
        if not isinstance(b, dict) or not isinstance(b.get("profile"), str):
            continue
        sets = b.get("set") or []
        sets = sets if isinstance(sets, list) and all(isinstance(x, str) for x in sets) else []
        try:
            prof = load_profile(_profile_ref(b["profile"], base), sets)
        except BadInput as exc:
            for problem in exc.problems:
                loc: tuple = ("boxes", i, "profile")
                if problem.startswith("--set "):
                    key = problem[len("--set "):].split(":", 1)[0]
                    j = next((j for j, x in enumerate(sets) if x.split("=", 1)[0].strip() == key), None)
                    loc = ("boxes", i, "set", j) if j is not None else ("boxes", i, "set")
                out.append(_line(pos, origin, loc, problem))
            continue
        if isinstance(b.get("name"), str):
            loaded[b["name"]] = prof
    return out, loaded


def _address_clashes(fleet: Fleet, pos: Positions, origin: str, profiles: dict) -> list[tuple[int, str]]:
    """Two boxes whose servers would listen on one ``address`` and ``container.port``: the
    rank 0 of every instance serves HTTP there (the router's worker URL), so the second server
    cannot bind the port and the router would list one worker twice. One line per clash, at
    the second box's ``address``, naming both boxes. Nodes above rank 0 serve no HTTP and are
    not compared; one machine may run several servers on different ports."""
    out: list[tuple[int, str]] = []
    index = {b.name: i for i, b in enumerate(fleet.boxes)}
    seen: dict[tuple[str, int], str] = {}
    for inst in fleet.instances():
        name = inst.boxes[0]
        prof = profiles.get(name)
        if prof is None:
            continue
        address = fleet.box(name).address
        key = (address, prof.container.port)  # canonical: netaddr.parse_host
        other = seen.setdefault(key, name)
        if other != name:
            where = position_of(pos, ("boxes", index[other], "address"))
            at = f" ({where[0]}:{where[1]})" if where else ""
            out.append(_line(pos, origin, ("boxes", index[name], "address"),
                             f"box {name} and box {other}{at} both serve on {host_port(address, prof.container.port)}: "
                             "the second server cannot bind the port and the router would get one worker "
                             "twice; give each box its own address, or one of them another container.port"))
    return out


def _router_clashes(fleet: Fleet, pos: Positions, origin: str, profiles: dict) -> list[tuple[int, str]]:
    """The router on its box binds ``router.port`` and ``router.metrics_port``: the server of
    that box (its profile's ``container.port``) cannot listen there too."""
    r = fleet.router
    prof = profiles.get(r.box) if r is not None else None
    if prof is None:
        return []
    return [_line(pos, origin, ("router", key), f"{port} is also the port box {r.box}'s server listens on "
                  "(container.port of its profile): one of them cannot bind it; choose another port")
            for key, port in (("port", r.port), ("metrics_port", r.metrics_port)) if port == prof.container.port]


def load_fleet(path: str | Path) -> LoadedFleet:
    """Read and validate a fleet file.

    Raises ``BadInput`` (exit 2) with one line per problem, all of them, each naming file:line
    and the dotted key: malformed YAML, unknown keys (with a did-you-mean), values out of range,
    a box's profile that does not load (unknown name, bad profile file, bad ``set`` item),
    duplicate names, unknown box references, a facts file that does not exist. The references
    between sections are checked once every field is valid.
    """
    p = Path(path)
    data, pos = load_yaml_with_positions(p)
    origin = str(p)
    if not isinstance(data, dict):
        raise BadInput(f"{origin}:1: a fleet file is a mapping of keys, not {type(data).__name__}")
    base = p.resolve().parent
    problems, profiles = _profile_problems(data, pos, origin, base)
    try:
        fleet = Fleet.model_validate(data)
    except ValidationError as exc:
        problems += format_validation_errors(exc, pos, origin, Fleet)
        fleet = None
    if fleet is not None:
        problems += _cross_check(fleet, pos, origin, base)
    if fleet is not None and not problems:
        problems += _address_clashes(fleet, pos, origin, profiles) + _router_clashes(fleet, pos, origin, profiles)
    if problems:
        raise BadInput(*[t for _, t in sorted(problems, key=lambda lt: lt[0])])
    out = LoadedFleet(fleet=fleet, path=str(p.resolve()))
    out._profiles.update(profiles)
    out._positions.update(pos)
    return out
