"""The ``serve`` supervisor: run SGLang as a child, forward signals, redact, diagnose.

``supervise(argv, ...)`` starts ``python -m sglang.launch_server ...`` (the argv a
``LaunchSpec`` carries) as a child process in its own session, and then

- forwards SIGTERM and SIGINT to it (SGLang's own handler then tears down its scheduler and
  detokenizer processes); after a forwarded signal the supervisor exits with the child's code;
- copies the child's output (stdout and stderr merged, line by line) to its own stderr with
  secrets masked (``redact.Redactor``; SGLang 0.5.19 logs the API key in its ``server_args=``
  startup line);
- on any other non-zero exit prints ``diagnose.diagnose`` of the last lines with the child's
  code and returns ``ExitCode.FAILED`` (4).

Secrets never reach the child's command line: values that SGLang only takes as flags (the API
key) are written to a private YAML file (mode 0600 in a 0700 directory) passed with SGLang's
``--config`` option (``sglang/srt/utils/server_args_config_parser.py``
``ConfigArgumentMerger``: YAML keys become flags), and the file is removed when the child
exits.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from escha_deploy.errors import ExitCode

from .diagnose import Diagnosis, Facts, diagnose
from .redact import Redactor

#: Lines kept for the diagnosis (the printed tail is diagnose.TAIL_LINES of these).
KEEP_LINES = 400


@dataclass
class Outcome:
    """How the child ended: its code (negative: killed by that signal), the forwarded signal
    (None when the supervisor forwarded none), the kept lines (redacted), and the diagnosis
    when one was made."""

    child_code: int
    forwarded: int | None
    lines: list[str]
    diagnosis: Diagnosis | None = None
    exit_code: int = 0
    extra: dict = field(default_factory=dict)


def write_secret_config(values: Mapping[str, str]) -> tuple[Path, Path]:
    """Write ``values`` (SGLang config keys -> secret values) to a private YAML file.

    Returns ``(file, directory)``; the caller removes the directory. The file is mode 0600 in a
    fresh 0700 directory (``tempfile.mkdtemp``), under ``$XDG_RUNTIME_DIR`` when set.
    """
    import yaml

    d = Path(tempfile.mkdtemp(prefix="escha-serve-", dir=os.environ.get("XDG_RUNTIME_DIR")))
    f = d / "secrets.yaml"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(dict(values), fh)
    return f, d


def exit_code_for(child_code: int) -> int:
    """A child's returncode as a process exit status: -N (killed by signal N) becomes 128+N."""
    return 128 - child_code if child_code < 0 else child_code


def supervise(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
    config_flag: str | None = None,
    config_secrets: Mapping[str, str] | None = None,
    facts: Facts | None = None,
    out: IO[str] | None = None,
) -> Outcome:
    """Run ``argv`` as a supervised child and return how it ended (see module docstring).

    ``env``: the child's full environment (default: ours). ``secrets``: values to mask in its
    output. ``config_flag`` + ``config_secrets``: when both are given, the secrets are written
    to a private YAML file and ``[config_flag, path]`` is appended to ``argv``. ``facts``: passed
    to the diagnosis (HiCache on, platform). ``out``: where the redacted output goes (stderr).
    ``Outcome.exit_code`` is what ``serve`` exits with: the child's code after a forwarded
    signal, 0 on success, ``ExitCode.FAILED`` (4) on any other failure.
    Raises ``OSError`` when the child cannot be started at all (the caller reports it).
    """
    out = out or sys.stderr
    redact = Redactor([*secrets, *(config_secrets or {}).values()])
    cmd = list(argv)
    tmpdir: Path | None = None
    if config_flag and config_secrets:
        cfg, tmpdir = write_secret_config(config_secrets)
        cmd += [config_flag, str(cfg)]
    kept: deque[str] = deque(maxlen=KEEP_LINES)
    forwarded: list[int] = []
    try:
        child = subprocess.Popen(
            cmd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches the child only through us
            text=True,
            errors="replace",
            bufsize=1,
        )
    except BaseException:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {}
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:
        for s in (signal.SIGTERM, signal.SIGINT):
            previous[s] = signal.signal(s, forward)
    try:
        assert child.stdout is not None
        for raw in child.stdout:
            line = redact(raw.rstrip("\n"))
            kept.append(line)
            out.write(line + "\n")
            out.flush()
        code = child.wait()
    finally:
        if on_main:
            for s, h in previous.items():
                signal.signal(s, h)
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    lines = list(kept)
    if forwarded:
        return Outcome(code, forwarded[0], lines, exit_code=exit_code_for(code))
    if code == 0:
        return Outcome(code, None, lines, exit_code=0)
    f = (facts or Facts()).model_copy(update={"exit_code": code})
    diag = diagnose(lines, f)
    for ln in diag.lines():
        out.write(ln + "\n")
    out.write(f"serve: SGLang exited with code {code}; exiting {int(ExitCode.FAILED)}\n")
    out.flush()
    return Outcome(code, None, lines, diagnosis=diag, exit_code=int(ExitCode.FAILED))
