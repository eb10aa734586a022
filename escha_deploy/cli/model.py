"""``escha-deploy model pull PROFILE|REPO[@REV]`` and ``model verify FOLDER``: fetch the
checkpoint a profile was sized for from the hub (``huggingface_hub``), verify every file
against the hub's recorded size and sha256, and pin it in a lock file beside the weights
(``escha_deploy.checkpoint``). Exit 2 bad input (no such repository or revision), 3 refused
(a hash that differs, a full disk, a folder of another model, a revision that moved)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import FormatOpt, OutputFormat, SetOpt

EXAMPLES = """
Examples:

  escha-deploy model pull rtx5060ti-tp2-fp8

  escha-deploy model pull Qwen/Qwen3.5-27B@main --to /srv/models/Qwen3.5-27B

  escha-deploy model verify /srv/models/Qwen3.x-27B-GPTQ-Int4

  escha-deploy model adopt ~/.cache/huggingface/hub/models--Qwen--Qwen3.5-27B-FP8/snapshots/COMMIT
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    model = typer.Typer(name="model", no_args_is_help=True, help="Fetch, verify and pin model checkpoints.")
    app.add_typer(model, name="model", rich_help_panel=PANEL_LIFECYCLE)
    _adopt_command(model)

    @model.command("pull", epilog=EXAMPLES)
    def pull_cmd(
        target: Annotated[str, typer.Argument(
            metavar="PROFILE|REPO[@REV]", help="A profile (its model.checkpoint, into its model.host_dir) or a "
            "hub repository id with an optional revision.")],
        to: Annotated[Optional[Path], typer.Option(
            "--to", help="The folder to pull into (default: the profile's model.host_dir).")] = None,
        token_file: Annotated[Optional[Path], typer.Option(
            "--token-file", help="File holding the hub token (default: the profile's container.hf_token_file); "
            "never printed.")] = None,
        offline: Annotated[bool, typer.Option(
            "--offline", help="Send no request: check what the folder holds against its lock file "
            "(also HF_HUB_OFFLINE=1).")] = False,
        update: Annotated[bool, typer.Option(
            "--update", help="Pull the revision's new commit when it moved since the lock file pinned it.")] = False,
        set_: SetOpt = None,
        format: FormatOpt = OutputFormat.table,
    ) -> None:
        """Pull a checkpoint: only the files SGLang needs, the disk checked first, resumable,
        every file verified, then pinned in escha-model.lock.json."""
        from escha_deploy.checkpoint.pull import parse_ref, pull
        from escha_deploy.utils.errors import BadInput
        from escha_deploy.launch.prepare import read_secret

        from .output import info, print_json

        repo, rev, folder, token_path = _target(target, list(set_ or []))
        folder = str(to) if to is not None else folder
        if folder is None:
            raise BadInput(f"model pull: {target}: no folder to pull into",
                           hint="--to DIR, or a profile whose model.host_dir is set")
        if token_file is not None:
            token_path = str(token_file)
        token = read_secret(token_path, "--token-file" if token_file else "container.hf_token_file") \
            if token_path else None
        if repo is None:
            raise BadInput(f"model pull: {target}: model.checkpoint.repo is null ({rev})",
                           hint="pull a repository by id: `escha-deploy model pull OWNER/NAME --to DIR`")
        parse_ref(repo)  # the repository id's shape, one line when wrong
        res = pull(repo, rev, folder, token=token, offline=offline, update=update, report=info)
        if format is OutputFormat.json:
            print_json({"folder": str(res.folder), "lock": res.lock.model_dump(mode="json"), "fetched": res.fetched,
                        "present": res.present, "fetched_bytes": res.fetched_bytes})
            return
        typer.echo(_printable(f"{res.lock.pin()}\t{res.folder}\t{len(res.lock.files)} files verified "
                   f"({len(res.fetched)} fetched, {len(res.present)} already here)"))

    @model.command("verify", epilog=EXAMPLES)
    def verify_cmd(
        folder: Annotated[Path, typer.Argument(help="A folder `model pull` filled (it holds escha-model.lock.json).")],
        format: FormatOpt = OutputFormat.table,
    ) -> None:
        """Re-check every file of a pulled folder against its lock file: size and sha256 (Git
        blob id for small files). Exit 3 naming each file that differs or is missing."""
        from escha_deploy.checkpoint.lock import verify_folder
        from escha_deploy.utils.errors import Refused

        from .output import print_json

        lock, problems = verify_folder(folder)
        if format is OutputFormat.json:
            print_json({"folder": str(folder), "pin": lock.pin(), "files": len(lock.files), "problems": problems})
        if problems:
            raise Refused(*(f"model verify: {p}" for p in problems),
                          hint=f"`escha-deploy model pull {lock.repo}@{lock.commit} --to {folder}` fetches them again")
        if format is not OutputFormat.json:
            typer.echo(_printable(f"{lock.pin()}\t{folder}\t{len(lock.files)} files verified"))


def _adopt_command(model: typer.Typer) -> None:
    @model.command("adopt", epilog=EXAMPLES)
    def adopt_cmd(
        folder: Annotated[Path, typer.Argument(help="A model folder already on disk (a copy, a download by "
                                               "hand, a Hugging Face cache snapshot).")],
        force: Annotated[bool, typer.Option("--force", help="Re-pin a folder that has a lock file.")] = False,
        format: FormatOpt = OutputFormat.table,
    ) -> None:
        """Check a local model folder offline and pin it: config.json, every shard the
        safetensors index names present and whole, the headers adding up, the 16-bit tensors
        of config.json's dtype; then the sha256 of each file (progress on stderr) into
        escha-model.lock.json, which `model verify` re-checks. Exit 3 naming each problem,
        2 for a folder that is not one or cannot be written; nothing is written on error."""
        from escha_deploy.checkpoint.adopt import adopt

        from .output import info, print_json

        lock = adopt(folder, report=info, force=force)
        if format is OutputFormat.json:
            print_json({"folder": str(folder), "lock": lock.model_dump(mode="json")})
            return
        typer.echo(_printable(f"{lock.pin()}\t{folder}\t{len(lock.files)} files pinned"))


def _printable(line: str) -> str:
    """``line`` without terminal controls: a lock's repository id and a folder's name are
    a file's words (``termtext.printable``)."""
    from escha_deploy.utils.termtext import printable

    return printable(line)


def _target(target: str, overrides: list[str]) -> tuple[str | None, str | None, str | None, str | None]:
    """``(repo, revision, folder, token file)`` of a profile or ``REPO[@REV]``. For a profile
    without a published checkpoint, ``repo`` is None and ``revision`` carries the source line."""
    from escha_deploy.checkpoint.pull import parse_ref
    from escha_deploy.profile import load_profile

    import os

    # OWNER/NAME[@REV] is a repository unless it is a profile file here (a path, or .yaml/.yml/.json)
    looks_like_file = target.startswith((".", "/", "~")) or target.endswith((".yaml", ".yml", ".json"))
    if "/" in target and not looks_like_file and not os.path.exists(target):
        repo, rev = parse_ref(target)
        return repo, rev, None, None
    prof = load_profile(target, overrides)
    cp = prof.model.checkpoint
    token = prof.container.hf_token_file
    if cp is None:
        from escha_deploy.utils.errors import BadInput

        raise BadInput(f"model pull: profile {prof.name} names no checkpoint (model.checkpoint)",
                       hint="pull a repository by id: `escha-deploy model pull OWNER/NAME --to DIR`")
    if cp.repo is None:
        return None, cp.source, prof.model.host_dir, token
    return cp.repo, cp.revision, prof.model.host_dir, token
