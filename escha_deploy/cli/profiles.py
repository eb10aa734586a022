"""``escha-deploy profiles list|show|validate``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .options import FormatOpt, OutputFormat, SetOpt

profiles_app = typer.Typer(help="List, show, copy and validate profiles.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(profiles_app, name="profiles", rich_help_panel="Planning")


@profiles_app.command("list")
def list_command(fmt: FormatOpt = OutputFormat.table) -> None:
    """The shipped profiles with their one-line descriptions."""
    from ..profile import list_profiles, load_profile

    rows = []
    for name in list_profiles():
        p = load_profile(name)
        rows.append({"name": name, "gpus": f"{p.hardware.gpu_count} x {p.hardware.gpu_name}",
                     "tp_size": p.runtime.tp_size, "kv_cache_dtype": p.runtime.kv_cache.dtype,
                     "needs": list(p.runtime.needs), "description": p.description})
    if fmt is OutputFormat.json:
        from .output import print_json

        print_json(rows)
        return
    from rich.table import Table

    from .output import stdout_console

    t = Table()
    for col in ("name", "gpus", "TP", "KV", "description"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["gpus"], str(r["tp_size"]), r["kv_cache_dtype"], r["description"])
    stdout_console().print(t)


@profiles_app.command("show")
def show_command(
    profile: Annotated[str, typer.Argument(help="Profile name or file (.yaml, .yml, .json); a shipped name wins "
                                           "over a file of the same name here: pass ./NAME for the file.")],
    set_: SetOpt = None,
    fmt: FormatOpt = OutputFormat.table,
    keys: Annotated[bool, typer.Option(
        "--keys", help="One line per key: value, default, unit, the SGLang flag it sets, and what it does.")] = False,
) -> None:
    """The fully resolved profile (extends and --set applied), every default filled in.

    The table format is YAML that `profiles validate` and `--profile FILE` read back as is
    (sizes keep their units); json gives bytes as numbers. --keys lists every key with its
    value, default, unit, SGLang flag and meaning (json: the same rows)."""
    from ..profile import load_profile, profile_to_data

    p = load_profile(profile, set_ or [])
    from ..pipeline import secret_path_problems

    secret_path_problems(p)  # a key typed where its file's path goes is refused, never shown
    if keys:
        from ..profile.keys import key_rows

        rows = key_rows(p)
        if fmt is OutputFormat.json:
            from .output import print_json

            print_json(rows)
            return
        for r in rows:
            flag = f"  [{r['sglang_flag']}]" if r["sglang_flag"] else ""
            value, default = (r[k] or '""' for k in ("value", "default"))  # an empty string, seen
            typer.echo(f"{r['key']} = {value}  (default {default}; {r['unit']}){flag}")
            if r["description"]:
                typer.echo(f"    {r['description']}")
        return
    if fmt is OutputFormat.json:
        from .output import print_json

        print_json(p)
        return
    import yaml

    typer.echo(yaml.safe_dump(profile_to_data(p, readable=True), sort_keys=False), nl=False)


def say_where_read(ref: str, verb: str) -> None:
    """One short stderr line for a shipped profile name (``-p NAME``): the file it was read
    from, which is escha-deploy's own copy (site-packages when installed), so an edit there is
    not what the user meant; ``profiles copy`` makes one to edit."""
    from ..profile import shipped_profile_file

    from .output import info

    path = shipped_profile_file(ref)
    if path is not None:
        info(f"{verb}: profile {ref} read from the shipped file {path} "
             f"(to edit a copy: `escha-deploy profiles copy {ref}`)")


@profiles_app.command("copy")
def copy_command(
    name: Annotated[str, typer.Argument(help="A shipped profile's name (see `escha-deploy profiles list`).")],
    dest: Annotated[Optional[str], typer.Argument(
        help="The copy's file (.yaml or .yml), or a folder to write NAME.yaml in. Default: ./NAME.yaml.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace DEST when it exists.")] = False,
) -> None:
    """Write an editable copy of a shipped profile and say how to use it.

    A shipped name (`-p NAME`) always reads escha-deploy's own file; the copy is read by its
    path (`-p ./NAME.yaml`). The copy is the shipped text, comments kept, so it plans as the
    shipped profile does until you edit it. Exit 2 (nothing written) for an unknown name or an
    existing DEST without --force."""
    import shlex

    from ..profile import copy_profile

    target = copy_profile(name, dest, force=force)
    shown = str(target) if target.is_absolute() or str(target).startswith(".") else f"./{target}"
    typer.echo(f"wrote {shown}: a copy of the shipped profile {name}")
    typer.echo(f"edit it, then pass its path: `escha-deploy plan -p {shlex.quote(shown)}` "
               f"(`-p {name}` keeps reading the shipped file)")


@profiles_app.command("validate")
def validate_command(
    profiles: Annotated[Optional[list[str]], typer.Argument(help="Names or files (default: every shipped profile); a shipped name wins over a file of the same name here: pass ./NAME for the file.")] = None,
) -> None:
    """Validate profiles: one line per error naming file:line and key; exit 2 on any error.
    Keys that load but do nothing are warnings on stderr (exit 0)."""
    from ..utils.errors import BadInput, EschaError
    from ..profile import list_profiles, load_profile

    from .output import warn

    problems: list[str] = []
    for ref in profiles or list_profiles():
        warnings: list[str] = []
        try:
            load_profile(ref, warnings=warnings)
            typer.echo(f"ok: {ref}")
        except EschaError as exc:
            problems.extend(exc.problems)
        for line in warnings:  # keys that do nothing: said, but not an error (exit stays 0)
            warn(line)
    if problems:
        raise BadInput(*problems)
