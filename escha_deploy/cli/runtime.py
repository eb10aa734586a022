"""``escha-deploy runtime apply | import | inventory | verify | rebase | describe``: the patched SGLang
runtime.

Heavy imports stay in the command bodies. Results go to stdout (table or ``--format json``),
progress and warnings to stderr; failures raise ``escha_deploy.utils.errors`` (exit 2 bad input,
3 refused: a reject, base drift or inventory drift).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from escha_deploy.cli.app import PANEL_RUNTIME
from escha_deploy.cli.options import FormatOpt, OutputFormat

SglangDirOpt = Annotated[
    Optional[Path],
    typer.Option("--sglang-dir", help="The installed sglang package directory "
                 "(.../site-packages/sglang). Default: found through --python."),
]
PythonOpt = Annotated[
    Optional[str],
    typer.Option("--python", help="SGLang's interpreter, used only to find the package "
                 "(never imports it). Default: $ESCHA_SGLANG_PYTHON, else this Python."),
]
StateDirOpt = Annotated[
    Optional[Path],
    typer.Option("--state-dir", help="Where runtime.json, the base inventory and the clean "
                 "base copies live. Default: the folder of /etc/escha/runtime.json."),
]
OverlayOpt = Annotated[
    Optional[Path],
    typer.Option("--overlay-dir", envvar="ESCHA_RUNTIME_OVERLAYS",
                 help="Your own patches, applied after escha-deploy's series (a `series` file, or "
                 "*.patch by name). See docs/runtime.md."),
]

BaseLockOpt = Annotated[
    Optional[str],
    typer.Option("--base-lock", envvar="ESCHA_BASE_LOCK",
                 help="The lock file of a commit-built SGLang (`escha-deploy runtime lock`): the tree must "
                 "match it file by file (each changed, missing or extra file named, exit 3). Empty: none. "
                 "See docs/runtime.md, \"A commit-built base\"."),
]


def _lock_path(base_lock: Optional[str]) -> Optional[Path]:
    """``--base-lock``'s file; ``None`` for none or empty (a plain `docker build` passes an empty
    build argument)."""
    return Path(base_lock) if base_lock else None


ForkOpt = Annotated[
    Optional[Path],
    typer.Option("--fork-dir", envvar="ESCHA_RUNTIME_FORK",
                 help="A fork's commits imported by `escha-deploy runtime import` (patches + "
                 "escha-fork.yaml), applied in the order the declaration gives with escha-deploy's series."),
]


def _state_dir(state_dir: Optional[Path]) -> Path:
    from escha_deploy.sglang.capabilities import runtime_description_path

    return state_dir or Path(runtime_description_path()).parent


def _description_file(state_dir: Optional[Path]) -> Path:
    """Where ``runtime apply`` writes the description: ``--state-dir``/runtime.json, else this
    machine's (``capabilities.runtime_description_path``: $ESCHA_RUNTIME_DESCRIPTION or
    /etc/escha/runtime.json)."""
    from escha_deploy.sglang.capabilities import runtime_description_path

    return state_dir / "runtime.json" if state_dir else Path(runtime_description_path())


#: ``escha-deploy runtime``: its commands are this module's functions below, registered on it
#: at import (as ``cli/profiles.py`` does); ``register`` adds the group to the app.
runtime_app = typer.Typer(help="Patch, inventory and verify the installed SGLang.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(runtime_app, name="runtime", rich_help_panel=PANEL_RUNTIME)


@runtime_app.command("apply")
def apply_cmd(
    sglang_dir: SglangDirOpt = None,
    python: PythonOpt = None,
    state_dir: StateDirOpt = None,
    overlay_dir: OverlayOpt = None,
    base_ref: Annotated[Optional[str], typer.Option(
        "--base-ref", help="The base image reference, recorded when the install is not a "
        "wheel (an image built from git).")] = None,
    expect_capabilities: Annotated[Optional[str], typer.Option(
        "--expect-capabilities", help="Comma list the build promised in its labels; "
        "refuse if the series gives another.")] = None,
    expect_series: Annotated[Optional[str], typer.Option(
        "--expect-series", help="Comma list of patch names the labels promised.")] = None,
    expect_sglang_version: Annotated[Optional[str], typer.Option(
        "--expect-sglang-version", help="The SGLang release the labels promised; refuse if the "
        "installed one is another (empty: not checked).")] = None,
    fork_dir: ForkOpt = None,
    base_lock: BaseLockOpt = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Apply escha-deploy's patch series (+ a fork's imported commits, + overlays) to the installed sglang,
    verify, write runtime.json."""
    from escha_deploy import __version__
    from escha_deploy.cli.output import info
    from escha_deploy.utils.paths import output_folder
    from escha_deploy.runtime import inventory as inv
    from escha_deploy.runtime import patching
    from escha_deploy.runtime.description import write_description

    sd = _state_dir(state_dir)
    # the state is written before the package is patched: refuse a folder that cannot be
    # made or written in here, not halfway (its parent must exist, as for other outputs)
    output_folder(sd, "--state-dir", make=False)
    if state_dir is None:  # this machine's description: `plan` of this host plans it from now on
        info(f"runtime apply: no --state-dir: writing this machine's runtime description to "
             f"{_description_file(None)} (plan and serve here then plan this runtime; "
             "plans of other boxes do not)")
    located = inv.locate(sglang_dir, python)
    info(f"sglang {located.version} at {located.package_dir} (Python {located.python})")
    if expect_sglang_version and located.version != expect_sglang_version:
        from escha_deploy.utils.errors import Refused

        from escha_deploy.runtime.lock import DEFAULT_LOCK
        from escha_deploy.sglang.releases import is_built_version

        lock_hint = (f" --base-lock {DEFAULT_LOCK} (the tree pinned first: `escha-deploy runtime lock`)"
                     if located.version and is_built_version(located.version) else "")
        raise Refused(f"build argument SGLANG_VERSION={expect_sglang_version!r} but the installed sglang "
                      f"at {located.package_dir} is {located.version}",
                      hint=f"build with --sglang-version {located.version}{lock_hint}, or on a base image that holds "
                      f"SGLang {expect_sglang_version}")
    result = patching.apply(located, sd, overlay_dir, base_ref, expect_capabilities,
                            expect_series, __version__, fork_dir=fork_dir, base_lock=_lock_path(base_lock))
    write_description(result.description, _description_file(state_dir))
    info(f"wrote {_description_file(state_dir)}")
    _print_description(result.description, fmt)


@runtime_app.command("verify")
def verify_cmd(
    sglang_dir: SglangDirOpt = None,
    python: PythonOpt = None,
    state_dir: StateDirOpt = None,
    overlay_dir: OverlayOpt = None,
    base_wheel: Annotated[Optional[Path], typer.Option(
        "--base-wheel", help="Read the clean base files from this stock wheel instead of "
        "the copies apply saved.")] = None,
    fork_dir: ForkOpt = None,
    base_lock: BaseLockOpt = None,
    first_use: Annotated[bool, typer.Option(
        "--first-use/--no-first-use", help="Also check what the server builds after ready for the L3 backends "
        "the series' profiles turn on: a C++ compiler, <openssl/sha.h> and -lcrypto for SGLang's HiCache hash "
        "extension (built here, and with torch present built and loaded by SGLang's own loader), and writable "
        "JIT cache folders.")] = False,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Check the installed sglang equals base + deltas; name every missing, extra and
    changed file (exit 3 on any). With --first-use, also what SGLang compiles on first use."""
    from escha_deploy.cli.output import print_json
    from escha_deploy.utils.errors import Refused
    from escha_deploy.runtime import inventory as inv
    from escha_deploy.runtime import patching

    located = inv.locate(sglang_dir, python)
    sd = _state_dir(state_dir)
    recorded = patching.recorded_series(_description_file(state_dir))
    result = patching.verify(located, sd, recorded, overlay_dir, base_wheel, fork_dir=fork_dir,
                             base_lock=_lock_path(base_lock))
    data = {"ok": result.drift.ok, "sglang_dir": str(located.package_dir),
            "base": result.base, "files": result.files,
            "expected_digest": result.expected_digest,
            "missing": result.drift.missing, "extra": result.drift.extra,
            "changed": result.drift.changed}
    if fmt == OutputFormat.json:
        print_json(data)
    elif result.drift.ok:
        print(f"ok: {result.files} files equal base {result.base} + "
              f"{len(result.deltas)} deltas (digest {result.expected_digest})")
    if not result.drift.ok:
        raise Refused(*result.drift.lines(),
                      hint="reinstall sglang and run `escha-deploy runtime apply`")
    if first_use:
        first_use_or_refuse(python)


@runtime_app.command("inventory")
def inventory_cmd(
    sglang_dir: SglangDirOpt = None,
    python: PythonOpt = None,
    wheel: Annotated[Optional[Path], typer.Option(
        "--wheel", help="Inventory this sglang wheel instead of the installed package.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Write the inventory JSON here (its folder must exist).")] = None,
    deltas: Annotated[bool, typer.Option(
        "--deltas", help="Show the deltas the series (+ overlays) makes to this base "
        "(computed on a clean copy: needs --wheel, or an unpatched install).")] = False,
    overlay_dir: OverlayOpt = None,
    fork_dir: ForkOpt = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """The base inventory (every file, size, sha256; no __pycache__) and its digest."""
    from escha_deploy.cli.output import info, print_json, stdout_console
    from escha_deploy.utils.paths import check_output, write_output
    from escha_deploy.runtime import inventory as inv
    from escha_deploy.runtime import patching

    if output is not None:
        check_output(output, "--output")  # before reading the wheel, not after
    if wheel is not None:
        tag, files = inv.scan_wheel(wheel)
        base, version, source = f"wheel:{tag}", inv.wheel_version(wheel), str(wheel)

        def read_base(rel: str) -> bytes | None:
            return inv.read_wheel_file(wheel, rel)
    else:
        located = inv.locate(sglang_dir, python)
        tag, files, version = located.wheel_tag, inv.scan(located.package_dir), located.version
        base, source = patching.base_id(located, None), str(located.package_dir)

        def read_base(rel: str) -> bytes | None:
            p = located.package_dir / rel
            return p.read_bytes() if rel in files else None
    committed = patching.committed_base_path(tag)
    matches = None
    if committed is not None:
        matches = inv.compare(files, inv.read_inventory(committed)[1]).ok
    data: dict = {"base": base, "source": source, "version": version, "files": len(files),
                  "bytes": sum(s for s, _ in files.values()), "digest": inv.digest(files),
                  "committed_inventory": committed.name if committed else None,
                  "matches_committed": matches}
    if deltas:
        d, _ = patching.compute_deltas(patching.load_patches(overlay_dir, fork_dir), read_base)
        data["deltas"] = {rel: (None if e is None else {"size": e[0], "sha256": e[1]})
                          for rel, e in sorted(d.items())}
    if output is not None:
        text, _ = inv.inventory_text(base, version, files)
        write_output(output, text, "--output")
        info(f"runtime inventory: wrote the inventory of {base} ({len(files)} files, digest "
             f"{data['digest'][:12]}) to {output}")
    if fmt == OutputFormat.json:
        print_json(data)
        return
    for k in ("base", "source", "version", "files", "bytes", "digest", "committed_inventory",
              "matches_committed"):
        print(f"{k}: {data[k]}")
    if deltas:
        from rich.table import Table

        dt = Table()
        dt.add_column("delta (sglang/...)", overflow="fold")
        dt.add_column("size")
        dt.add_column("sha256", overflow="fold")
        for rel, e in data["deltas"].items():
            dt.add_row(rel, "deleted" if e is None else str(e["size"]),
                       "" if e is None else e["sha256"])
        stdout_console().print(dt)


@runtime_app.command("lock")
def lock_cmd(
    sglang_dir: SglangDirOpt = None,
    python: PythonOpt = None,
    output: Annotated[Path, typer.Option(
        "--output", "-o", help="The lock file to write (its folder must exist); keep it with the build "
        "context, where `escha-deploy build` reads it.")] = Path("runtime_base/sglang.lock.json"),
    commit: Annotated[Optional[str], typer.Option(
        "--commit", help="The commit the tree is built from (hex, 7-40 digits). Default: the one its "
        "version names (+gCOMMIT).")] = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Pin an SGLang built from a commit: every file's size and sha256 into a lock file, after finding
    its nearest release (docs/runtime.md, "A commit-built base")."""
    import os
    import re

    from escha_deploy.cli.output import info, print_json
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.paths import check_output, write_output
    from escha_deploy.runtime import inventory as inv
    from escha_deploy.runtime import patching
    from escha_deploy.runtime.lock import lock_text, nearest_findings
    from escha_deploy.sglang.releases import built_commit, nearest_release

    check_output(output, "--output")  # before hashing, not after
    if commit is not None and not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        raise BadInput(f"--commit {commit!r}: expected a commit hash, 7 to 40 lowercase hex digits")
    located = inv.locate(sglang_dir, python)
    if located.version is None:
        raise BadInput(f"{located.package_dir}: no version (no dist-info METADATA, no _version.py): "
                       "cannot tell which SGLang this is")
    named = built_commit(located.version)
    if commit and named and not (commit.startswith(named) or named.startswith(commit)):
        raise BadInput(f"--commit {commit}: the tree's version {located.version} names commit {named}; "
                       "name the parent one way")
    nearest = nearest_release(located.version, str(located.package_dir))
    files = _scan_with_progress(located.package_dir)
    # the rebase check: our series for that release applies to this tree's own files
    patches = patching.load_patches(None, None, patching.series_release_of(located.version))
    patching.compute_deltas(patches, lambda rel: (located.package_dir / rel).read_bytes() if rel in files else None)
    parser = None
    if python or os.environ.get(inv.ENV_SGLANG_PYTHON):  # the tree's own parser, in its own interpreter
        import dataclasses
        import tempfile

        from escha_deploy.runtime.lock import read_parser, side_files
        from escha_deploy.utils.paths import source_checkout

        checkout = source_checkout()
        if checkout is None or not (checkout / "scripts" / "gen_flag_catalog.py").is_file():
            raise BadInput("runtime lock --python: the releases' generators (scripts/gen_flag_catalog.py) are not "
                           "here: run it in the escha-deploy checkout you build from")
        flags_out, metrics_out = side_files(output)
        info(f"reading the parser of SGLang {located.version} in {python or os.environ[inv.ENV_SGLANG_PYTHON]} "
             "(the releases' generators)")
        with tempfile.TemporaryDirectory(prefix="escha-lock-") as tmp:
            found_parser = read_parser(python or os.environ[inv.ENV_SGLANG_PYTHON], located.package_dir,
                                       located.version, nearest, checkout / "scripts", Path(tmp) / "flags.json",
                                       Path(tmp) / "metrics.json")
            write_output(flags_out, (Path(tmp) / "flags.json").read_bytes(), "--output")
            write_output(metrics_out, (Path(tmp) / "metrics.json").read_bytes(), "--output")
        parser = {**dataclasses.asdict(found_parser), "flags_file": flags_out.name, "metrics_file": metrics_out.name}
    found = nearest_findings(files, nearest, patching.committed_inventories(nearest), parser)
    text, digest = lock_text(located.version, commit or named, nearest, files, parser)
    write_output(output, text, "--output")
    data = {"lock": str(output), "version": located.version, "commit": commit or named,
            "nearest_release": nearest, "files": len(files), "bytes": sum(s for s, _ in files.values()),
            "digest": digest, "series_applies": [p.name for p in patches], "differs_count": found.differs_count,
            "differs": found.differs, "parser": parser, "parser_differs": found.parser, "unchecked": found.unchecked}
    if fmt == OutputFormat.json:
        print_json(data)
        return
    from escha_deploy.utils.termtext import printable

    print(f"locked: SGLang {printable(located.version)} at {located.package_dir}: {len(files)} files, "
          f"digest {digest}")
    print(f"nearest release: {nearest} (the version's release prefix); our series applies: "
          f"{', '.join(p.name for p in patches)}")
    print(f"differs from {nearest}: {found.differs_count} files" + "".join(f"\n  {printable(d)}" for d in found.differs))
    for line in found.parser:
        print(f"differs from {nearest}: {printable(line)}")
    for line in found.unchecked:
        print(f"not checked: {line}")
    info(f"wrote {output}; build with `escha-deploy build --sglang-version {located.version} --base-image REF` "
         f"(the lock read from {output} when it is runtime_base/sglang.lock.json of the context, else "
         "--base-lock)")


def _scan_with_progress(package_dir: Path) -> dict:
    """``inventory.scan`` of ``package_dir`` with a progress bar on stderr (rich; about 4,400
    files for an SGLang tree)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from escha_deploy.cli.output import stderr_console
    from escha_deploy.runtime import inventory as inv

    rels = inv.list_files(package_dir)
    with Progress(TextColumn("hashing sglang/"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=stderr_console(), transient=False) as progress:
        task = progress.add_task("hash", total=len(rels))
        return inv.hash_files(package_dir, rels, lambda: progress.advance(task))


@runtime_app.command(
    "import",
    epilog="Example (X.Y.Z: the SGLang release the fork is made on, one our series is made for or "
    "rebased onto):\n\n\b\n  git -C ~/sglang format-patch vX.Y.Z..escha -o ~/escha-fork\n"
    "  escha-deploy runtime import ~/escha-fork --base-wheel sglang-X.Y.Z-*.whl",
)
def import_cmd(
    directory: Annotated[Path, typer.Argument(
        help="`git format-patch vX.Y.Z..BRANCH` output of your SGLang fork, with its "
        "escha-fork.yaml declaration.", show_default=False)],
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Where the build finds it: a folder of the build context "
        "(made when missing; its parent must exist). "
        "Default: runtime_fork/ of the checkout `escha-deploy build` uses (this folder when "
        "it holds Dockerfile.hicache).")] = None,
    base_wheel: Annotated[Optional[Path], typer.Option(
        "--base-wheel", help="Also apply everything to the clean files of this stock "
        "sglang wheel (of the release the fork is made on) now, so a hunk that does not apply is refused here, not in "
        "the image build.")] = None,
    base_dir: Annotated[Optional[Path], typer.Option(
        "--base-dir", help="Also apply everything to the clean files of this SGLang package folder now: the "
        "commit-built parent the fork's escha-fork.yaml names (parent:), pinned by --base-lock.")] = None,
    base_lock: BaseLockOpt = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Import a fork's commits (git format-patch against the SGLang release it is made on, SGLang repository
    layout): check them, order them with escha-deploy's series, and copy them for the build."""
    from escha_deploy.cli.output import info, print_json
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.paths import output_folder
    from escha_deploy.runtime import inventory as inv
    from escha_deploy.runtime import patching
    from escha_deploy.runtime.fork import DECLARATION, fork_patch_files

    if not directory.is_dir():
        raise BadInput(f"{directory}: not a folder")
    if output is None:
        from escha_deploy.utils.paths import PACKAGE_DIR

        ctx = Path.cwd() if (Path.cwd() / "Dockerfile.hicache").is_file() else PACKAGE_DIR.parent
        if not (ctx / "Dockerfile.hicache").is_file():
            raise BadInput("--output: no escha-deploy checkout here to copy the import into",
                           hint="run it in the checkout you build from, or pass --output DIR")
        output = ctx / "runtime_fork"
    output_folder(output, "--output", make=False)  # before the checks, not after
    release = None
    if base_wheel is not None:
        if not base_wheel.is_file():
            raise BadInput(f"--base-wheel {base_wheel}: no such file")
        from escha_deploy.runtime.fork import check_fork_release

        release = inv.wheel_version(base_wheel)
        check_fork_release(directory, release)
    base_files = None
    if base_dir is not None:
        if base_wheel is not None:
            raise BadInput("runtime import: give one of --base-wheel (a release) or --base-dir (a commit-built parent)")
        from escha_deploy.runtime.fork import check_fork_base

        located = inv.locate(base_dir)
        base_files = inv.scan(located.package_dir)
        if base_lock:
            from escha_deploy.runtime.lock import read_lock

            read_lock(Path(base_lock)).check_tree(base_files, located.version, str(located.package_dir))
        release = located.version
        check_fork_base(directory, release, inv.digest(base_files), str(located.package_dir))
    fi = patching.fork_with_series(directory, patching.series_release_of(release))
    deltas = None
    if base_wheel is not None:
        deltas, _ = patching.compute_deltas(
            fi.order, lambda rel: inv.read_wheel_file(base_wheel, rel))
    elif base_dir is not None:
        pkg = inv.locate(base_dir).package_dir
        deltas, _ = patching.compute_deltas(
            fi.order, lambda rel: (pkg / rel).read_bytes() if rel in (base_files or {}) else None)
    if output.resolve() != directory.resolve():
        from escha_deploy.utils.ownedfolder import replace_owned

        try:
            files = {f.name: f.read_bytes()
                     for f in [*fork_patch_files(directory), directory / DECLARATION] if f.is_file()}
        except OSError as exc:
            raise BadInput(f"{directory}: cannot read: {exc.strerror or exc}") from None
        # what the build reads (fork_patch_files, DECLARATION) and an older import's "series"
        replace_owned(output, files,
                      lambda n: n.endswith(".patch") or n in (DECLARATION, "series"),
                      "--output", "runtime import")
    by_file = {c.file: c for c in fi.commits}
    data = {
        "directory": str(directory), "output": str(output),
        "order": [{"name": p.name, "source": p.source,
                   "commit": by_file[p.name].commit if p.source == "fork" else None,
                   "subject": by_file[p.name].subject if p.source == "fork"
                   else p.header.get("Subject"),
                   "capabilities": list(p.capabilities),
                   "files": [f"sglang/{t}" for t in p.touched],
                   "left_out": list(by_file[p.name].left_out) if p.source == "fork" else []}
                  for p in fi.order],
        "dropped": fi.dropped,
        "capabilities": patching.capabilities_of(fi.order),
        "deltas_checked_against": str(base_wheel or base_dir) if (base_wheel or base_dir) else None,
        "deltas": len(deltas) if deltas is not None else None,
    }
    if fmt == OutputFormat.json:
        print_json(data)
        return
    from rich.table import Table
    from rich.text import Text

    from escha_deploy.cli.output import stdout_console
    from escha_deploy.utils.termtext import printable

    t = Table(title=f"apply order ({len(fi.order)} patches)")
    for col in ("#", "patch", "commit", "capabilities", "left out"):
        t.add_column(col, overflow="fold")
    for n, row in enumerate(data["order"], 1):
        t.add_row(str(n), Text(printable(row["name"]) + "\n" + printable(row["subject"] or "")),
                  (row["commit"] or "escha-deploy")[:12], ", ".join(row["capabilities"]),
                  ", ".join(row["left_out"]))
    stdout_console().print(t)
    for line in fi.dropped:
        print(f"dropped: {line}")
    print(f"capabilities: {', '.join(data['capabilities']) or 'none'}")
    if deltas is not None:
        print(f"applies cleanly to {base_wheel.name if base_wheel else base_dir}: {len(deltas)} files changed or added")
    if output.resolve() != directory.resolve():
        if output.name == "runtime_fork" and (output.parent / "Dockerfile.hicache").is_file():
            how = "`escha-deploy build --hicache` there"
        else:
            how = ("`escha-deploy build --hicache --fork-dir DIR`, DIR being that folder "
                   "relative to the checkout")
        info(f"copied {len(fi.commits)} patches to {output}; build with {how}")


@runtime_app.command("rebase")
def rebase_cmd(
    check: Annotated[Optional[str], typer.Option(
        "--check", metavar="VERSION", help="The SGLang release to check a series (and --fork-dir's "
        "commits) against; read-only. The series: that release's own when one is committed "
        "(runtime_patches/VERSION/), else the one our patches are made for; --series-of picks.")] = None,
    onto: Annotated[Optional[str], typer.Option(
        "--onto", metavar="VERSION", help="Write our series re-derived for this SGLang release: each "
        "hunk carried over, found where it moved, or taken from the release's rebase.yaml "
        "(catalog/releases/VERSION/), with its outcome and reason in the patch.")] = None,
    wheel: Annotated[Optional[Path], typer.Option(
        "--wheel", help="That release's wheel (offline: `pip download --no-deps sglang==VERSION`). "
        "Default: sglang-VERSION-*.whl here or in .cache/wheels.")] = None,
    fork_dir: Annotated[Optional[Path], typer.Option(
        "--fork-dir", help="A fork's `git format-patch` commits to check too (their own chain).")] = None,
    series_of: Annotated[Optional[str], typer.Option(
        "--series-of", metavar="RELEASE", help="--check: the series committed for this release "
        "instead.")] = None,
    resolutions: Annotated[Optional[Path], typer.Option(
        "--resolutions", help="--onto: the rebase.yaml to read. Default: the release's in the "
        "catalog.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="--onto: the folder to write the series into (made when missing; "
        "its parent must exist). Default: runtime_patches/VERSION of the checkout here.")] = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Check a series against another SGLang release's wheel (--check: which patches and fork
    commits apply, fail with file and hunk, or are already there; exit 0 when all apply, 3
    otherwise), or write our series rebased onto it (--onto)."""
    from escha_deploy.utils.errors import BadInput

    if (check is None) == (onto is None):
        raise BadInput("runtime rebase: give one of --check VERSION or --onto VERSION")
    if onto is not None:
        if series_of is not None or fork_dir is not None:
            raise BadInput("runtime rebase --onto: --series-of and --fork-dir go with --check")
        _rebase_onto(onto, wheel, resolutions, output, fmt)
        return
    if resolutions is not None or output is not None:
        raise BadInput("runtime rebase --check: --resolutions and --output go with --onto")
    _rebase_check(check, wheel, fork_dir, series_of, fmt)  # type: ignore[arg-type]


@runtime_app.command("describe")
def describe_cmd(
    description: Annotated[Optional[Path], typer.Option(
        "--description", help="Default: $ESCHA_RUNTIME_DESCRIPTION, else /etc/escha/runtime.json.")] = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Print the runtime description (exit 3 when there is none: a stock runtime)."""
    from escha_deploy.sglang.capabilities import runtime_description_path
    from escha_deploy.utils.errors import Refused
    from escha_deploy.runtime.description import read_description

    path = description or Path(runtime_description_path())
    desc = read_description(path)
    if desc is None:
        raise Refused(f"{path}: no runtime description (a stock runtime, no capabilities)")
    _print_description(desc, fmt)


def _rebase_check(check: str, wheel: Optional[Path], fork_dir: Optional[Path],
                  series_of: Optional[str], fmt: OutputFormat) -> None:
    import dataclasses

    from escha_deploy.cli.output import print_json
    from escha_deploy.utils.errors import Refused
    from escha_deploy.runtime.patching import rebased_releases, series_dir
    from escha_deploy.runtime.rebase import rebase_check
    from escha_deploy.runtime.series import read_series

    if series_of is None:
        series_of = check if check in rebased_releases() else None
    else:
        from escha_deploy.utils.errors import BadInput
        from escha_deploy.sglang.releases import series_release

        known = [series_release(), *rebased_releases()]
        if series_of not in known:
            raise BadInput(f"--series-of {series_of}: no patch series for that release (there are: "
                           f"{', '.join(known)})")
    result = rebase_check(check, wheel, read_series(series_dir(series_of)), fork_dir)
    if fmt == OutputFormat.json:
        print_json({**dataclasses.asdict(result), "ok": result.ok})
    else:
        print(f"SGLang {result.release} ({Path(result.wheel).name}):")
        for v in result.verdicts:
            print(f"  {v.source} {v.label}: {v.status}"
                  + ("" if v.status != "already" else " (its changes are in the release)"))
            for f in v.failures:
                print(f"    {f.line()}")
        for line in result.unreadable:
            print(f"  cannot check: {line}")
    if not result.ok:
        failing = [f"{v.label} ({v.status}: {', '.join(sorted({f.file for f in v.failures})) or 'in the release'})"
                   for v in result.verdicts if v.status != "applies"]
        raise Refused(f"SGLang {result.release}: " + ("; ".join(failing) or "some fork files cannot be checked"),
                      hint=f"`escha-deploy runtime rebase --onto {result.release}` writes our series for it "
                      "(docs/runtime.md, \"Upgrading SGLang\")")


def _rebase_onto(version: str, wheel: Optional[Path], resolutions: Optional[Path],
                 output: Optional[Path], fmt: OutputFormat) -> None:
    from escha_deploy.cli.output import info, print_json
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.sglang.releases import releases_dir, series_release
    from escha_deploy.runtime.patching import series_dir
    from escha_deploy.runtime.rebase import RESOLUTIONS, load_resolutions, rebase_onto, write_rebased
    from escha_deploy.runtime.series import read_series

    if version == series_release():
        raise BadInput(f"--onto {version}: our series is made for {version}; nothing to rebase")
    if output is None:
        if not (Path.cwd() / "runtime_patches" / "series").is_file():
            raise BadInput("--output: no runtime_patches/ of a checkout here to write into",
                           hint="run it in the escha-deploy checkout, or pass --output DIR")
        output = Path.cwd() / "runtime_patches" / version
    res_file = resolutions or releases_dir() / version / RESOLUTIONS
    if resolutions is not None and not resolutions.is_file():
        raise BadInput(f"--resolutions {resolutions}: no such file")
    result = rebase_onto(version, wheel, read_series(series_dir()), series_release(),
                         load_resolutions(res_file))
    written = write_rebased(result, output)
    if fmt == OutputFormat.json:
        print_json({"release": result.release, "from": result.source_release, "wheel": result.wheel,
                    "output": str(output), "patches": [
                        {"name": p.name, "hunks": [dataclasses_asdict(o) for o in p.outcomes]}
                        for p in result.patches]})
    else:
        print(f"SGLang {result.release}: our series for {result.source_release}, rebased "
              f"({Path(result.wheel).name}):")
        for p in result.patches:
            print(f"  {p.name}")
            for o in p.outcomes:
                print(f"    {o.line()}")
    info(f"wrote {len(written)} files to {output}; review the diff, then `escha-deploy runtime "
         f"rebase --check {version}`")


def dataclasses_asdict(obj) -> dict:
    import dataclasses

    return dataclasses.asdict(obj)


def _print_description(desc, fmt: OutputFormat) -> None:
    from escha_deploy.cli.output import print_json

    if fmt == OutputFormat.json:
        print_json(desc)
        return
    rows = [
        ("sglang", f"{desc.sglang_version} at {desc.sglang_dir}"),
        ("base", f"{desc.base} ({'committed' if desc.base_inventory_committed else 'recorded'} "
                 f"inventory {desc.base_inventory_digest})"),
        ("python", desc.python),
        ("series", ", ".join(f"{e.name} [{e.source}]" for e in desc.series)),
        *[("fork commit", f"{e.commit} {e.subject} ({e.author}, {e.date})"
           + (f"; left out: {', '.join(e.left_out)}" if e.left_out else ""))
          for e in desc.series if e.source == "fork"],
        *[("dropped", d) for d in desc.dropped],
        ("capabilities", ", ".join(desc.capabilities) or "none"),
        ("inventory digest", desc.inventory_digest),
        *([("built from a commit", desc.built.summary())] if desc.built is not None else []),
    ]
    from escha_deploy.utils.termtext import printable

    for k, v in rows:
        print(f"{k}: {printable(str(v))}")


def first_use_or_refuse(python: Optional[str]) -> None:
    """``runtime verify --first-use``: the first-use check (``runtime/first_use.py``) with an L3
    backend on, in this environment; prints one ``first use:`` line per check passed, raises
    ``Refused`` (exit 3) with every problem, one line each."""
    from escha_deploy.utils.errors import Refused
    from escha_deploy.runtime import first_use as fu

    result = fu.check(l3=True, python=python)
    problems = [p for row in result["checks"] for p in row["problems"]]  # type: ignore[union-attr]
    if problems:
        raise Refused(*[f"first use: {p}" for p in problems],
                      hint="Dockerfile.hicache installs g++ and libssl-dev; rebuild the image (`escha-deploy build`)")
    for row in result["checks"]:  # type: ignore[union-attr]
        print(f"first use: {row['name']}: {row['detail']}")
