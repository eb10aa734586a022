"""One planning pipeline for every command that plans: ``plan``, ``up``, ``up --dry-run``,
``serve``, ``compose``, ``doctor`` and every ``fleet`` verb. Each command is its choice of two
sources, and one call:

    plan_request(profile, facts source, runtime source, options)
      -> gather(profile, facts source)            -> Gathered (frozen)
      -> resolve_runtime(profile, gathered, runtime source) -> Runtime(release, capabilities, where)
      -> decide(profile, gathered, runtime)       -> Plan
      -> render(plan) for a launch                -> LaunchSpec (the argv rendered once, then checked)
      => Request(gathered, runtime, plan, launch, refusals, warnings)

- facts sources: ``ThisHost`` (with or without doctor's findings), ``DescribedHost``
  (``--host-ram``, a fleet box's ``host_ram``), ``FactsFileHost`` (``--facts``,
  ``$ESCHA_FACTS``, a fleet box's facts), ``InContainer`` (``serve`` inside the container);
  ``facts_source`` turns a command's options into one.
- runtime sources: ``ProfileTarget`` (an image built for the profile), ``RuntimeClaim`` (what an
  image's labels or this runtime's description say: ``up``, ``serve``), ``BoxRuntime`` (the
  box planned: this machine's description, a facts file's runtime section, ``--sglang-version``,
  ``plan --compare``'s release).
- one module per stage: ``sources`` (the two kinds of source), ``gathering`` (``gather``),
  ``runtime`` (``resolve_runtime``), ``decision`` (``decide``), ``rendering`` (``render``),
  ``request`` (``plan_request``, ``plan_here``); a stage module is not named as its function,
  which this package re-exports;
  beside them what the stages use and what a plan is turned into: ``argv`` (the server's argv
  and env), ``spec`` (the ``LaunchSpec``), ``compare`` (``plan --compare``), ``chart`` (``plan
  --chart``). This package re-exports the stages' public names, each loaded when first asked
  for, so a command that only reads a launch spec (``status``) loads no stage.
- ``decide`` and ``render`` are pure; ``gather`` reads files (and NVML). An unsafe plan is
  returned, never raised: ``Request.refusals`` says what refuses it. Heavy models are imported
  inside the functions that need them, so a table plan never imports the launch-spec models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from escha_deploy.pipeline.sources import (
        BoxRuntime,
        DescribedHost,
        FactsFileHost,
        FactsSource,
        InContainer,
        ProfileTarget,
        RuntimeClaim,
        RuntimeSource,
        ThisHost,
        facts_source,
    )
    from escha_deploy.pipeline.gathering import (
        Gathered,
        HostReading,
        gather,
        read_described_host,
        read_facts_file_host,
        read_this_host,
    )
    from escha_deploy.pipeline.runtime import (
        Runtime,
        resolve_runtime,
        runtime_here,
    )
    from escha_deploy.pipeline.decision import (
        BadArgv,
        check_rendered_argv,
        decide,
    )
    from escha_deploy.pipeline.rendering import (
        launch_facts,
        render,
        render_container,
    )
    from escha_deploy.pipeline.request import (
        LaunchOptions,
        Options,
        Request,
        hicache_off_warning,
        plan_here,
        plan_request,
        profile_file,
        secret_path_problems,
        shown_path,
    )

#: each public name of the pipeline, and the stage module that defines it
_STAGES = {
    "BoxRuntime": "sources",
    "DescribedHost": "sources",
    "FactsFileHost": "sources",
    "FactsSource": "sources",
    "InContainer": "sources",
    "ProfileTarget": "sources",
    "RuntimeClaim": "sources",
    "RuntimeSource": "sources",
    "ThisHost": "sources",
    "facts_source": "sources",
    "Gathered": "gathering",
    "HostReading": "gathering",
    "gather": "gathering",
    "read_described_host": "gathering",
    "read_facts_file_host": "gathering",
    "read_this_host": "gathering",
    "Runtime": "runtime",
    "resolve_runtime": "runtime",
    "runtime_here": "runtime",
    "BadArgv": "decision",
    "check_rendered_argv": "decision",
    "decide": "decision",
    "launch_facts": "rendering",
    "render": "rendering",
    "render_container": "rendering",
    "LaunchOptions": "request",
    "Options": "request",
    "Request": "request",
    "hicache_off_warning": "request",
    "plan_here": "request",
    "plan_request": "request",
    "profile_file": "request",
    "secret_path_problems": "request",
    "shown_path": "request",
}

__all__ = [
    "BadArgv",
    "BoxRuntime",
    "DescribedHost",
    "FactsFileHost",
    "FactsSource",
    "Gathered",
    "HostReading",
    "InContainer",
    "LaunchOptions",
    "Options",
    "ProfileTarget",
    "Request",
    "Runtime",
    "RuntimeClaim",
    "RuntimeSource",
    "ThisHost",
    "check_rendered_argv",
    "decide",
    "facts_source",
    "gather",
    "hicache_off_warning",
    "launch_facts",
    "plan_here",
    "plan_request",
    "profile_file",
    "read_described_host",
    "read_facts_file_host",
    "read_this_host",
    "render",
    "render_container",
    "resolve_runtime",
    "runtime_here",
    "secret_path_problems",
    "shown_path",
]


def __getattr__(name: str) -> object:
    """``escha_deploy.pipeline.NAME``: the stage module that defines ``NAME``, imported when first
    asked for (PEP 562)."""
    stage = _STAGES.get(name)
    if stage is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{stage}"), name)
    globals()[name] = value
    return value
