"""Registers the verbs. Each verb lives in its own module with a ``register(app)`` function
that adds its command(s) under a help panel; heavy imports stay inside the command bodies so
``escha-deploy plan`` starts fast.
"""

from __future__ import annotations

import importlib

import typer
from typer.core import TyperGroup

#: Verb modules, in help order. Add a module here when you add a verb.
VERB_MODULES: tuple[str, ...] = (
    "up",
    "down",
    "status",
    "logs",
    "ask",
    "diagnose",
    "compose",
    "serve",
    "plan",
    "model",
    "profiles",
    "doctor",
    "runtime",
    "build",
    "bench",
    "fleet",
)

PANEL_LIFECYCLE = "Lifecycle"
PANEL_PLANNING = "Planning"
PANEL_RUNTIME = "Runtime"
PANEL_MEASURE = "Measure"


#: The top-level command names each verb module registers. ``build_app(command)`` imports and
#: registers only the module that serves ``command``, so ``plan`` does not build the other verbs'
#: parameters (tests/cli/test_startup.py checks this map against what the modules register).
COMMANDS: dict[str, str] = {
    "up": "up", "down": "down", "status": "status", "logs": "logs", "ask": "ask", "diagnose": "diagnose", "compose": "compose",
    "serve": "serve", "plan": "plan", "model": "model", "profiles": "profiles", "doctor": "doctor",
    "runtime": "runtime", "build": "build", "bench": "bench", "canary": "bench", "fleet": "fleet",
}


class PanelGroup(TyperGroup):
    """The top-level group: help lists the commands under their ``rich_help_panel`` headings
    (Lifecycle, Runtime, Planning, Measure) in plain text.

    Help is rendered by click's plain formatter, not typer's rich renderer: importing
    ``typer.rich_utils`` (rich's console, markdown, syntax and traceback modules) costs more than
    the rest of ``--help`` together; docs/performance.md has the measurements and the decision.
    """

    def format_commands(self, ctx, formatter) -> None:
        panels: dict[str, list[tuple[str, str]]] = {}
        visible = [(n, c) for n in self.list_commands(ctx)
                   if (c := self.get_command(ctx, n)) is not None and not c.hidden]
        if not visible:
            return
        limit = formatter.width - 6 - max(len(n) for n, _ in visible)
        for name, cmd in visible:
            panel = getattr(cmd, "rich_help_panel", None) or "Commands"
            panels.setdefault(panel, []).append((name, cmd.get_short_help_str(limit)))
        for panel, rows in panels.items():
            with formatter.section(panel):
                formatter.write_dl(rows)


def build_app(command: str | None = None) -> typer.Typer:
    """The CLI with every verb, or with only the module that registers ``command`` when it is a
    known command name (what ``main`` passes: the first word of the command line)."""
    app = typer.Typer(
        name="escha-deploy",
        help="Run a patched SGLang server with HiCache on a small multi-GPU box, "
        "with a memory plan that is safe for the machine.",
        cls=PanelGroup,
        rich_markup_mode=None,  # plain help and usage errors: see PanelGroup
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    # A callback keeps the app a group even when only one verb is registered (typer runs a lone
    # command as the whole program otherwise).
    app.callback()(_root)
    modules = (COMMANDS[command],) if command in COMMANDS else VERB_MODULES
    for name in modules:
        importlib.import_module(f"escha_deploy.cli.{name}").register(app)
    _keep_examples_whole(app)
    return app


def _keep_examples_whole(app: typer.Typer) -> None:
    """Mark each indented paragraph of every epilog (the examples) with click's ``\\b``, which
    prints a paragraph's lines as written: click rewraps paragraphs to the terminal, and joined
    two examples into one line or broke one across two."""
    for info in app.registered_commands:
        if info.epilog:
            info.epilog = _no_rewrap(info.epilog)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _keep_examples_whole(group.typer_instance)


def _no_rewrap(epilog: str) -> str:
    paragraphs = epilog.split("\n\n")
    return "\n\n".join("\b\n" + p.lstrip("\n") if p.strip() and p.lstrip("\n").startswith("  ")
                       and not p.lstrip("\n").startswith("\b") else p for p in paragraphs)


def _print_version(value: bool) -> None:
    if not value:
        return
    for line in version_lines():
        typer.echo(line)
    raise typer.Exit(0)


def version_lines() -> list[str]:
    """What ``--version`` prints: the package, the SGLang release it targets, and the patch
    series it ships (each patch with its capabilities, and one sha256 over the patches' own)."""
    import hashlib

    from escha_deploy import __version__
    from escha_deploy.utils.paths import runtime_patches_dir
    from escha_deploy.sglang.releases import default_release, release_key, supported_releases
    from escha_deploy.runtime.series import read_series

    patches = read_series(runtime_patches_dir())
    digest = hashlib.sha256("".join(p.sha256 for p in patches).encode()).hexdigest()[:12]
    # oldest first, as a reader scans versions (index.yaml's order is the CI's, default first)
    releases = sorted(supported_releases(), key=release_key)
    out = [f"escha-deploy {__version__}", f"SGLang target: {default_release()} (supported: {', '.join(releases)})",
           f"patch series: {len(patches)} patches, sha256 {digest}"]
    out += [f"  {p.name}: {', '.join(p.capabilities) or 'no capabilities'}" for p in patches]
    return out


def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version, the SGLang release targeted and the patch series."),
) -> None:
    pass
