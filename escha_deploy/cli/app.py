"""Registers the verbs. Each verb lives in its own module with a ``register(app)`` function
that adds its command(s) under a help panel; heavy imports stay inside the command bodies so
``escha-deploy plan`` starts fast.
"""

from __future__ import annotations

import importlib

import typer

#: Verb modules, in help order. Add a module here when you add a verb.
VERB_MODULES: tuple[str, ...] = (
    "up",
    "down",
    "status",
    "logs",
    "compose",
    "serve",
    "plan",
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


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="escha-deploy",
        help="Run a patched SGLang 0.5.19 server with HiCache on a small multi-GPU box, "
        "with a memory plan that is safe for the machine.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    for name in VERB_MODULES:
        importlib.import_module(f"escha_deploy.cli.{name}").register(app)
    return app
