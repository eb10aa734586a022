"""Within each command a short option has one meaning: the CLI's own parser, walked command by
command (``typer.main.get_command`` of the app every verb registers into)."""

from __future__ import annotations

import typer.main

from escha_deploy.cli.app import build_app


def _commands(cmd, path: tuple[str, ...], parent=None):
    """Every command under ``cmd`` with its context (help option names are inherited from the
    root's context settings)."""
    ctx = cmd.make_context(path[-1], [], parent=parent, resilient_parsing=True)
    yield path, cmd, ctx
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _commands(sub, (*path, name), ctx)


def _short_options(cmd, ctx) -> dict[str, list[str]]:
    """Each short option of ``cmd`` (help included) and the long names it stands for."""
    params = list(cmd.params)
    help_opt = cmd.get_help_option(ctx)
    if help_opt is not None and help_opt not in params:
        params.append(help_opt)
    seen: dict[str, list[str]] = {}
    for p in params:
        if not hasattr(p, "secondary_opts") or p.param_type_name != "option":
            continue
        names = [*p.opts, *p.secondary_opts]
        long = next((n for n in names if n.startswith("--")), p.name)
        for name in names:
            if name.startswith("-") and not name.startswith("--"):
                seen.setdefault(name, []).append(long)
    return seen


def test_each_short_option_has_one_meaning_per_command():
    root = typer.main.get_command(build_app())
    walked, clashes = 0, []
    for path, cmd, ctx in _commands(root, ("escha-deploy",)):
        walked += 1
        for short, longs in _short_options(cmd, ctx).items():
            if len(longs) > 1:
                clashes.append(f"{' '.join(path)}: {short} is {' and '.join(longs)}")
    assert walked > 20  # every verb and sub-verb was registered and walked
    assert clashes == []


def test_logs_dash_f_is_follow_as_its_example_says():
    from escha_deploy.cli.logs import EXAMPLES

    root = typer.main.get_command(build_app())
    logs = root.commands["logs"]
    ctx = logs.make_context("logs", [], parent=root.make_context("escha-deploy", [], resilient_parsing=True),
                            resilient_parsing=True)
    assert _short_options(logs, ctx)["-f"] == ["--follow"]
    example = next(ln.split()[1:] for ln in EXAMPLES.splitlines() if ln.strip().endswith(" -f"))
    ctx = logs.make_context("logs", example[1:])
    assert ctx.params["follow"] is True and ctx.params["profile"] == "rtx5060ti-tp2-fp8"


def test_no_option_shows_its_parsers_name_as_its_value():
    """typer names an option's value after its ``parser=`` function: 21 options showed
    ``<parse>``; ``number_option`` names it ``<number>`` or ``<integer>``."""
    root = typer.main.get_command(build_app())
    shown = []
    for path, cmd, ctx in _commands(root, ("escha-deploy",)):
        for p in cmd.params:
            record = p.get_help_record(ctx) if hasattr(p, "get_help_record") else None
            if record and "<parse>" in record[0]:
                shown.append(f"{' '.join(path)} {record[0]}")
    assert shown == []


def test_every_example_in_a_help_is_printed_whole():
    """An ``escha-deploy ...`` example of a command's epilog is one line of its --help, as
    written: click rewraps a paragraph unless it starts with ``\\b``, and joined `plan`'s,
    `logs`'s and `runtime import`'s examples into one another."""
    root = typer.main.get_command(build_app())
    broken = []
    for path, cmd, ctx in _commands(root, ("escha-deploy",)):
        examples = [ln.strip() for ln in (cmd.epilog or "").splitlines() if ln.strip().startswith("escha-deploy ")]
        shown = {ln.strip() for ln in cmd.get_help(ctx).splitlines()}
        broken += [f"{' '.join(path)}: {ex}" for ex in examples if ex not in shown]
    assert broken == []
