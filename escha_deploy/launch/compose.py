"""compose.yaml rendered from the same ``ContainerSpec`` as ``up``, as a dict dumped by PyYAML.

The file must not depend on the machine that renders it (the committed ``compose.yaml`` is
checked against a fresh render), so it carries no plan digest and plans nothing (a facts
file's plan when one is given): ``serve`` plans inside the container at start. The
one thing tied to the rendering machine is where the build context is: the escha-deploy
checkout holding ``Dockerfile.hicache``, written relative to the compose file's folder
(``build_context``). Settings follow ``docker.create_args``; what compose
cannot express is said in the header (the restart policy cannot change once ready, so it is
``"no"``: a crash loop of pinned allocations can bring down a WSL2 host).

Checked by ``docker-compose config`` (Debian's 1.29) and, where a packaged copy exists, the
compose specification's JSON schema (tests/launch/test_compose.py).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from escha_deploy.pipeline.spec import ContainerSpec
from escha_deploy.utils.netaddr import host_port

from .docker import LABEL_PLAN_DIGEST, PROFILE_TARGET, SERVE_MODE_ENV

if TYPE_CHECKING:
    from escha_deploy.planner.result import Plan
    from escha_deploy.profile import Profile

#: Where the image is built from (the repository root, Dockerfile.hicache).
DOCKERFILE = "Dockerfile.hicache"


def source_checkout(cwd: str | Path | None = None) -> Path | None:
    """The checkout ``docker compose`` builds ``Dockerfile.hicache`` from
    (``paths.source_checkout``, the rule ``escha-deploy build`` uses for its default context)."""
    from escha_deploy.utils.paths import source_checkout as find

    return find(cwd, DOCKERFILE)


def build_context(output: str | Path | None, checkout: Path | None) -> str | None:
    """``build.context`` as written in the compose file: ``checkout`` relative to the folder of
    ``output`` (compose resolves a relative context against the compose file's folder), or to
    the current folder when the file goes to stdout (also through a path under ``/dev`` or
    ``/proc`` such as ``/dev/stdout``, whose folder says nothing of where the text lands).
    ``"."`` for a file in the checkout root (the committed ``compose.yaml``); ``None`` when
    there is no checkout. Both folders are resolved first (symbolic links followed)."""
    if checkout is None:
        return None
    device = output is not None and os.path.abspath(output).startswith(("/dev/", "/proc/"))
    folder = Path(output).parent if output is not None and not device else Path.cwd()
    return os.path.relpath(Path(checkout).resolve(), folder.resolve())


def release_build_args(profile: Profile) -> dict[str, str]:
    """The build arguments of ``Dockerfile.hicache`` for the release ``profile`` plans
    (``runtime.sglang_version``, else the default release): ``BASE_IMAGE`` (``runtime.base_image``)
    and ``SGLANG_VERSION`` (the series applied is that release's; the build refuses a base that
    holds another), as ``escha-deploy build --sglang-version`` passes them."""
    from escha_deploy.sglang.releases import default_release

    return {"BASE_IMAGE": profile.runtime.base_image,
            "SGLANG_VERSION": profile.runtime.sglang_version or default_release()}


def _header(profile: str, build: bool = True) -> str:
    how = ("# docker compose up -d   # (or Debian's docker-compose 1.29) builds Dockerfile.hicache and\n"
           if build else
           "# docker compose up -d   # (or Debian's docker-compose 1.29) starts the image, built first\n"
           "# from an escha-deploy checkout (`escha-deploy build --hicache --context CHECKOUT`), and\n")
    return (
        f"# Rendered by `escha-deploy compose --profile {profile}`; do not edit by hand:\n"
        "# change the profile (or --set) and render again.\n"
        "#\n"
        + how +
        "# runs `escha-deploy serve`, which plans against what the container sees and starts SGLang.\n"
        "# `escha-deploy up` does the same through docker-py, plus a preflight, a ready wait, the\n"
        "# restart policy switch once ready and a plan-vs-server drift check.\n"
    )


def render(spec: ContainerSpec, *, build: bool = True, context: str = ".",
           build_args: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose document for ``spec`` as a dict (service name ``sglang``). ``build``: add a
    ``build:`` section (``context``: the escha-deploy checkout, relative to the compose file's
    folder; ``dockerfile``: ``Dockerfile.hicache``, relative to the context; ``args``:
    ``build_args``, when given: ``release_build_args``)."""
    svc: dict[str, Any] = {}
    if build:
        svc["build"] = {"context": context, "dockerfile": DOCKERFILE, **({"args": build_args} if build_args else {})}
    svc["image"] = spec.image
    svc["container_name"] = spec.name
    svc["entrypoint"] = list(spec.entrypoint)
    svc["command"] = list(spec.command)
    svc["init"] = spec.init
    if spec.ipc_mode:
        svc["ipc"] = spec.ipc_mode
    if spec.shm_size_bytes:
        svc["shm_size"] = spec.shm_size_bytes
    svc["ulimits"] = {k: {"soft": s, "hard": h} for k, (s, h) in sorted(spec.ulimits.items())}
    svc["ports"] = [f"{host_port(spec.port_host_ip, spec.port_host)}:{spec.port_container}"]  # [v6]:host:container
    svc["environment"] = dict(sorted({**spec.environment, SERVE_MODE_ENV: "container"}.items()))
    vols = [
        {"type": m.kind, "source": m.source, "target": m.target, "read_only": m.read_only}
        for m in spec.mounts
    ]
    if spec.profile_file:
        vols.append({"type": "bind", "source": spec.profile_file, "target": PROFILE_TARGET,
                     "read_only": True})
    if vols:
        svc["volumes"] = vols
    secrets = {}
    if spec.secret_files:
        svc["secrets"] = []
        for target, source in sorted(spec.secret_files.items()):
            name = target.rsplit("/", 1)[-1]
            secrets[name] = {"file": source}
            svc["secrets"].append({"source": name, "target": name})
    dev: dict[str, Any] = {"driver": "nvidia", "capabilities": ["gpu"]}
    if isinstance(spec.gpus, list):
        dev["device_ids"] = list(spec.gpus)
    elif spec.gpu_count and spec.platform != "wsl2":
        dev["count"] = spec.gpu_count
    else:
        dev["count"] = "all"
    if not (isinstance(spec.gpus, list) and not spec.gpus):
        svc["deploy"] = {"resources": {"reservations": {"devices": [dev]}}}
    svc["security_opt"] = list(spec.security_opt)
    if spec.cap_drop:
        svc["cap_drop"] = list(spec.cap_drop)
    if spec.cap_add:
        svc["cap_add"] = list(spec.cap_add)
    svc["labels"] = {k: v for k, v in sorted(spec.labels.items()) if k != LABEL_PLAN_DIGEST}
    svc["stop_signal"] = "SIGTERM"
    svc["stop_grace_period"] = f"{spec.stop_timeout_s}s"
    svc["restart"] = "no"
    port = spec.port_container
    svc["healthcheck"] = {
        # The image has Python; no curl needed. /health: sglang/srt/entrypoints/http_server.py.
        "test": ["CMD", "python3", "-c",
                 f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=5)"],
        "interval": "30s",
        "timeout": "10s",
        "retries": 3,
        "start_period": "1800s",
    }
    doc: dict[str, Any] = {"services": {"sglang": svc}}
    named = sorted({m.source for m in spec.mounts if m.kind == "volume"})
    if named:  # compose creates a named volume only when the file declares it
        doc["volumes"] = {n: {"name": n} for n in named}
    if secrets:
        doc["secrets"] = secrets
    return doc


def dump(doc: dict[str, Any], profile: str) -> str:
    """YAML text with the header comment (PyYAML, insertion order kept)."""
    build = "build" in doc["services"]["sglang"]
    return (_header(profile, build) + _volumes_note(doc)
            + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100))


def _volumes_note(doc: dict[str, Any]) -> str:
    """Header lines naming the named volumes the file declares (the JIT cache), so the reader
    knows what `docker compose up` creates and keeps."""
    from escha_deploy.pipeline.spec import CONTAINER_JIT_CACHE

    names = list(doc.get("volumes", {}))
    if not names:
        return ""
    return (f"#\n# Named volume {', '.join(names)}: mounted at {CONTAINER_JIT_CACHE}, where FlashInfer, Triton,\n"
            "# torch extensions (SGLang's HiCache hash extension) and SGLang keep what they compile on\n"
            "# first use: writable whatever the image's home allows, and kept across restarts.\n")


@dataclass
class Rendered:
    """A rendered compose file: ``text`` (the YAML with its header), ``plan`` (the facts file's
    plan; None without one: nothing was planned), ``image`` (the service's ``image:``) and
    ``warnings`` (one line each, for stderr: a facts file's plan without HiCache, or with a device
    KV pool SGLang caps)."""

    text: str
    plan: Plan | None
    image: str
    warnings: list[str] = field(default_factory=list)


def render_profile(profile_ref: str, overrides: Sequence[str] = (), *, facts_file: str | None = None,
                   context: str | None = ".") -> str:
    """``compose_profile(...).text``: the compose.yaml text of a profile."""
    return compose_profile(profile_ref, overrides, facts_file=facts_file, context=context).text


def fork_needs_lines(profile, image: str) -> list[str]:
    """One warning when the profile needs capabilities our patch series does not provide
    (``runtime.description.fork_capabilities``: a fork's, e.g. ``int2-kv``): the image the file
    builds or runs has them only when built with the fork's commits (Dockerfile.hicache copies
    ``FORK_DIR``, default runtime_fork/, which ``runtime import`` fills); else the container's
    ``serve`` refuses, exit 3, naming them."""
    from escha_deploy.runtime.description import fork_capabilities

    fork = fork_capabilities(list(profile.runtime.needs))
    if not fork:
        return []
    return [f"{profile.name} needs {', '.join(fork)}, which escha-deploy's patch series does not provide: {image} "
            "has them only when built with the fork's commits (`escha-deploy runtime import DIR` into runtime_fork/, "
            "which Dockerfile.hicache copies; docs/runtime.md, \"Bring your fork\"), else its serve refuses them"]


def compose_profile(profile_ref: str, overrides: Sequence[str] = (), *, facts_file: str | None = None,
                    context: str | None = ".") -> Rendered:
    """Load a profile and render its compose.yaml.

    Without ``facts_file`` nothing is planned and no host is described: the container half of
    a launch needs no plan (``pipeline.plan_request`` with no facts: ``render_container``), so the render is the same on every
    machine; the flags the profile adds (``runtime.extra_args``) are checked against its
    release's flag catalog first (``pipeline.plan_request`` with no facts: ``BadInput``, exit 2, nothing
    rendered). ``serve`` plans for real inside the container.

    ``facts_file``: the box's facts, mounted read-only and named by ``ESCHA_FACTS``, so the
    container's ``serve`` plans from it and reaches the plan ``up --facts`` makes. It is planned
    here through the pipeline (``pipeline.plan_request``: a ``FactsFileHost``, the profile's needs; the argv checked) and
    checked as ``up`` checks one: ``unsafe`` raises ``Refused`` (exit 3) with one ``plan: REASON``
    line per reason and nothing rendered; ``hicache_off`` is a warning (the server starts
    without HiCache); the container half is rendered from that plan.
    ``context``: the build context as written (``build_context``); ``None``: no ``build:``
    section (no escha-deploy checkout to build from).
    """
    from pathlib import Path

    from escha_deploy.utils.errors import Refused
    from escha_deploy.pipeline import (FactsFileHost, LaunchOptions, Options, ProfileTarget, hicache_off_warning,
                                       plan_request, profile_file, secret_path_problems)
    from escha_deploy.profile import load_profile

    profile = load_profile(profile_ref, overrides)
    secret_path_problems(profile)  # the key typed where its file's path goes: never in the file
    warnings: list[str] = []
    plan: Plan | None = None
    if facts_file:
        req = plan_request(profile, FactsFileHost(facts_file), ProfileTarget(), Options(launch=LaunchOptions(
            overrides=tuple(overrides), profile_file=profile_file(profile_ref),
            facts_file=str(Path(facts_file).resolve()))))
        plan, launch = req.plan, req.launch
        assert launch is not None
        if plan.verdict == "unsafe":
            sets = "".join(f" --set {o}" for o in overrides)
            raise Refused(*plan.refusal_lines(), hint=(
                f"`escha-deploy plan --profile {profile_ref}{sets} --facts {facts_file}` shows the budget"))
        if (off := hicache_off_warning(plan)) is not None:
            warnings.append(off)
        # a size SGLang caps rather than refuses (planner._cap_fixed_tokens): said where the file is made
        warnings += [w for w in plan.warnings if w.startswith("runtime.max_total_tokens:")]
        # the NCCL settings this box's plan decided (NVML's facts, doctor's smoke test) shown in
        # the file too: the container's `serve` plans from the mounted facts file to the same ones
        nccl = {k: v for k, v in launch.env.items() if k.startswith("NCCL_")}
        spec = launch.container.model_copy(update={"environment": {**launch.container.environment, **nccl}})
    else:
        # no host facts: the profile's runtime.extra_args checked against its release, the
        # container half rendered (the container plans for itself where it runs)
        spec = plan_request(profile, None, ProfileTarget(), Options(launch=LaunchOptions(
            overrides=tuple(overrides), profile_file=profile_file(profile_ref))))
    # the container settings `up` refuses (docker.check_spec: beyond loopback without an API
    # key, ...) are refused here too, exit 3, with nothing rendered
    from .docker import check_spec

    if problems := check_spec(spec):
        raise Refused(*problems)
    warnings += fork_needs_lines(profile, spec.image)
    # the header's command names the profile as the user gave it (a file's path), as it runs
    text = dump(render(spec, build=context is not None, context=context or ".",
                       build_args=release_build_args(profile)), shlex.quote(profile_ref))
    return Rendered(text, plan, spec.image, warnings)
