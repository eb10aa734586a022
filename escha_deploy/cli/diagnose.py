"""``escha-deploy diagnose [FILE|-]``: read a server log from anywhere and say the cause, the
evidence lines and the fix. Exit 0 when a known cause is proven, 5 when nothing conclusive
matched, 2 when the file cannot be read."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .options import FormatOpt, OutputFormat, number_option

EXAMPLES = """
Examples:

\b
  escha-deploy diagnose server.log
  escha-deploy diagnose server.log --profile linux-tp2-l3 --kernel-log
  docker logs my-sglang 2>&1 | escha-deploy diagnose - --exit-code 137
  escha-deploy logs --profile rtx5060ti-tp2-fp8 --diagnose
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    @app.command("diagnose", rich_help_panel=PANEL_LIFECYCLE, epilog=EXAMPLES)
    def diagnose_command(
        file: Annotated[str, typer.Argument(help="The log file, or - for standard input.")] = "-",
        exit_code: Annotated[Optional[int], typer.Option(
            "--exit-code", help="The server's exit status (137 or -9: killed by SIGKILL).",
            parser=number_option(-255, 255, integer=True))] = None,
        oom_killed: Annotated[Optional[bool], typer.Option(
            "--oom-killed/--no-oom-killed",
            help="Whether the cgroup's memory.events oom_kill count rose (docker inspect: State.OOMKilled); "
            "unknown when not given.")] = None,
        hicache: Annotated[Optional[bool], typer.Option(
            "--hicache/--no-hicache", help="Whether HiCache was on; read from the log's server_args= line "
            "when not given, else unknown.")] = None,
        wsl2: Annotated[Optional[bool], typer.Option(
            "--wsl2/--no-wsl2", help="Whether the server ran under WSL2; unknown when not given.")] = None,
        profile: Annotated[Optional[str], typer.Option(
            "--profile", "-p", help="The profile the server ran: its launch as `up` renders it for this machine "
            "decides which fixes are already in effect (none is printed), and HiCache and the platform when not "
            "given.")] = None,
        sets: Annotated[Optional[list[str]], typer.Option(
            "--set", help="KEY=VALUE overrides of --profile, as the launch had them.")] = None,
        kernel_log: Annotated[bool, typer.Option(
            "--kernel-log/--no-kernel-log", help="Also read this machine's kernel log (dmesg, else journalctl -k) "
            "for the GPU's lines: Xid errors, a GPU lost from the bus, WSL2's dxgkrnl failures.")] = False,
        fmt: FormatOpt = OutputFormat.table,
    ) -> None:
        """Explain a server log: cause, evidence lines and fix for each known failure."""
        import sys

        from escha_deploy.utils.errors import BadInput, ExitCode
        from escha_deploy.launch.diagnose import Facts, diagnose

        from escha_deploy.utils.redact import Redactor

        cut = False
        try:
            if file == "-":
                text = read_tail(sys.stdin.buffer)
            else:
                import os
                import stat

                st = os.stat(file)
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                    raise BadInput(f"{file}: a device, not a log file")
                with open(file, "rb") as fh:  # a FIFO blocks for its writer here, as `cat FIFO` would
                    regular = stat.S_ISREG(os.fstat(fh.fileno()).st_mode)
                    text = read_end(fh) if regular else read_tail(fh)
                    cut = regular and os.fstat(fh.fileno()).st_size > MAX_LOG_BYTES
        except OSError as exc:
            raise BadInput(f"{file}: {exc.strerror or exc}") from None
        given: dict[str, object] = {"exit_code": exit_code, "oom_kill": oom_killed}
        if hicache is not None:
            given["hicache_enabled"] = hicache
        if wsl2 is not None:
            given["platform"] = "wsl2" if wsl2 else "linux"
        known = launch_known(profile, sets or []) if profile else {}
        facts = Facts(**{"platform": None, **known, **given})
        redact = Redactor()  # a log from anywhere may hold a key (SGLang's server_args= line)
        lines = text.splitlines()
        kernel: list[str] = []
        how = ""
        if kernel_log:
            from escha_deploy.doctor.kernel_log import gpu_lines

            kernel, how = gpu_lines()
            if not kernel and how.startswith("the kernel log could not"):
                typer.echo(f"warning: diagnose: {how}", err=True)
        diag = diagnose([redact(line) for line in lines + kernel], facts)
        n = len(lines)
        emit(diag, fmt, source=f"{n:,} line{'s' if n != 1 else ''} of "
             + ("standard input" if file == "-" else file)
             + (f" (its last {MAX_LOG_BYTES // 2**20} MiB)" if cut else "")
             + (f", and {len(kernel)} GPU line{'s' if len(kernel) != 1 else ''} of `{how}`" if kernel_log and kernel
                else ", and no GPU line in the kernel log" if kernel_log and how and not how.startswith("the kernel")
                else "")
             + (f"; fixes checked against {profile}'s launch" if profile else ""))
        raise typer.Exit(int(ExitCode.OK if diag.conclusive else ExitCode.INCONCLUSIVE))


def launch_known(profile_ref: str, sets: list[str]) -> dict[str, object]:
    """``diagnose.Facts`` fields from ``profile_ref``'s launch as `up` would render it on this
    machine (``pipeline.plan_here``, then the launch spec): what it sets, HiCache, the platform,
    the largest registered host buffer. Bad input (the profile) raises as `plan` does."""
    from escha_deploy.launch.diagnose import launch_facts
    from escha_deploy.pipeline import BoxRuntime, LaunchOptions, Options, facts_source, plan_here
    from escha_deploy.profile import load_profile

    prof = load_profile(profile_ref, sets)
    req = plan_here(prof, facts_source(), BoxRuntime(), Options(launch=LaunchOptions()))
    assert req.launch is not None  # Options.launch was given
    return launch_facts(req.plan, req.launch)


#: The most of a log read (its end): the causes are in the last lines, and /dev/zero or a
#: multi-GB log must not exhaust memory.
MAX_LOG_BYTES = 64 * 2**20


def read_tail(fh, limit: int = MAX_LOG_BYTES) -> str:
    """The last ``limit`` bytes of a binary stream (a file or a pipe), decoded as UTF-8 with
    replacement; reads in 1 MiB chunks, keeping at most ``limit`` + 1 MiB in memory."""
    import collections

    chunks: collections.deque[bytes] = collections.deque()
    kept = 0
    while True:
        chunk = fh.read(2**20)
        if not chunk:
            break
        chunks.append(chunk)
        kept += len(chunk)
        while kept - len(chunks[0]) >= limit:
            kept -= len(chunks.popleft())
    return b"".join(chunks)[-limit:].decode("utf-8", errors="replace")


def read_end(fh, limit: int = MAX_LOG_BYTES) -> str:
    """The last ``limit`` bytes of a regular file as it was when opened (its size then, by
    ``fstat``), decoded as UTF-8 with replacement: a log that a running server keeps writing
    is read to the end it had, not followed, and the part before the last ``limit`` bytes is
    skipped, not read. The first line may start mid-line when the file was longer. A file that
    reports size 0 (``/proc``) is read up to ``limit`` bytes from its start."""
    import os

    size = os.fstat(fh.fileno()).st_size
    start = max(0, size - limit)
    fh.seek(start)
    chunks, left = [], (size - start) or limit
    while left > 0:
        chunk = fh.read(min(left, 2**20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def emit(diag, fmt: OutputFormat, source: str | None = None) -> None:
    """Print a diagnosis on stdout (it is the command's result): text, or JSON. ``source``:
    what was read, in words, for the text's first line (``Diagnosis.lines``)."""
    if fmt is OutputFormat.json:
        from .output import print_json

        print_json({"conclusive": diag.conclusive, "exit_code": diag.exit_code,
                    "matches": [m.model_dump() for m in diag.matches]})
        return
    from escha_deploy.utils.redact import printable

    for line in diag.lines(tail=False, source=source):
        typer.echo(printable(line))  # a log's escape sequences never reach the terminal
    if not diag.conclusive and diag.matches:
        typer.echo("  no cause proven: the lines above are likely, not certain")
