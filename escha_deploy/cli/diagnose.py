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
        fmt: FormatOpt = OutputFormat.table,
    ) -> None:
        """Explain a server log: cause, evidence lines and fix for each known failure."""
        import sys

        from escha_deploy.errors import BadInput, ExitCode
        from escha_deploy.launch.diagnose import Facts, diagnose

        from escha_deploy.launch.redact import Redactor

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
        facts = Facts(exit_code=exit_code, oom_kill=oom_killed, hicache_enabled=hicache,
                      platform=None if wsl2 is None else "wsl2" if wsl2 else "linux")
        redact = Redactor()  # a log from anywhere may hold a key (SGLang's server_args= line)
        lines = text.splitlines()
        diag = diagnose([redact(line) for line in lines], facts)
        n = len(lines)
        emit(diag, fmt, source=f"{n:,} line{'s' if n != 1 else ''} of "
             + ("standard input" if file == "-" else file)
             + (f" (its last {MAX_LOG_BYTES // 2**20} MiB)" if cut else ""))
        raise typer.Exit(int(ExitCode.OK if diag.conclusive else ExitCode.INCONCLUSIVE))


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
    from escha_deploy.launch.redact import printable

    for line in diag.lines(tail=False, source=source):
        typer.echo(printable(line))  # a log's escape sequences never reach the terminal
    if not diag.conclusive and diag.matches:
        typer.echo("  no cause proven: the lines above are likely, not certain")
