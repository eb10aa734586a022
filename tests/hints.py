"""Every ``escha-deploy`` command the tool prints runs as printed: collected from what the suite
sees and checked with the CLI's own parser.

``record(text)`` keeps each backticked ``escha-deploy ...`` command of ``text`` (hints, fixes,
warnings, file headers) with the folder it was printed in; tests/conftest.py records every
in-process CLI run (``escha_deploy.cli.main.main``: its stdout and stderr) and every
``EschaError`` made (its lines and hint), and checks them all when the session ends
(``problems``). On a hint line, a command outside backticks is a problem too. A command parses when typer's parser (``typer.main.get_command`` of the app)
accepts its words as printed (``shlex``, up to a shell operator such as ``> FILE``), and its
``--profile`` resolves (a shipped name or a
file, from that folder) unless it is a placeholder in capitals (``--profile PROFILE``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

#: A command in backticks: what a hint asks the user to run.
COMMAND = re.compile(r"`(escha-deploy(?: [^`]*)?)`")
#: A placeholder the user fills in: PROFILE, FILE, IMAGE, BOX (capitals, digits, _ and -).
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_-]*$")


@dataclass(frozen=True)
class Seen:
    command: str
    cwd: str
    where: str


SEEN: dict[tuple[str, str], Seen] = {}
#: The test being run (set by tests/conftest.py), for the report.
current = {"test": ""}


def commands(text: str) -> list[str]:
    """The backticked ``escha-deploy`` commands of ``text``, in order."""
    return COMMAND.findall(text)


#: ``escha-deploy`` and a word outside backticks on a hint line: when the word is a verb, a
#: command the user cannot copy as printed.
UNQUOTED = re.compile(r"\bescha-deploy ([a-z][a-z-]*)")
#: Verbs a printed hint may name before they exist, each with why it is allowed for now;
#: tests/cli/test_hints.py fails once one exists, so its entry goes with it.
PENDING: dict[tuple[str, str], str] = {}
BAD: dict[tuple[str, str], str] = {}
_checking: list[str] = []


def record(text: str, cwd: str | None = None) -> None:
    """Check each command of ``text`` now (its profile file and folder exist now), from ``cwd``
    (default: the current folder); keep the ones that would not run as printed."""
    if _checking:  # an error made while checking (an unknown profile) is the check's, not a hint
        return
    cwd = cwd or os.getcwd()
    for cmd in commands(text):
        if (cmd, cwd) not in SEEN:
            SEEN[(cmd, cwd)] = Seen(cmd, cwd, current["test"])
            _checking.append(cmd)
            try:
                why = check(cmd, cwd)
            finally:
                _checking.pop()
            if why is not None:
                BAD[(cmd, cwd)] = f"{current['test']}: `{cmd}`: {why}"
    for line in text.splitlines():
        if line.startswith("hint: ") and any(w in _app().commands for w in UNQUOTED.findall(COMMAND.sub("", line))):
            BAD.setdefault((line, ""), f"{current['test']}: a command not in backticks: {line}")


_APP = []


def _app():
    if not _APP:
        import typer.main

        from escha_deploy.cli.app import build_app

        _APP.append(typer.main.get_command(build_app()))
    return _APP[0]


def check(command: str, cwd: str | Path = ".") -> str | None:
    """Why ``command`` would not run as printed from ``cwd``, or ``None`` when it parses and its
    profile resolves."""
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        words = list(lex)
    except ValueError as exc:
        return f"not shell words: {exc}"
    # the command ends where the shell takes over: `escha-deploy doctor --format json > FILE`
    ops = [i for i, w in enumerate(words) if w and set(w) <= set("<>|&;()")]
    words = words[:ops[0]] if ops else words
    if not words or words[0] != "escha-deploy":
        return "does not start with escha-deploy"
    cmd, args, ctx, path = _app(), words[1:], None, ["escha-deploy"]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ctx = cmd.make_context("escha-deploy", list(args))
            while hasattr(cmd, "commands"):
                rest = [*ctx._protected_args, *ctx.args]  # typer's vendored click 8.2 Context
                if not rest:
                    return f"`{' '.join(path)}` needs a sub-command"
                if (path[-1], rest[0]) in PENDING:
                    return None
                name, cmd, rest = cmd.resolve_command(ctx, rest)
                path.append(name)
                ctx = cmd.make_context(name, list(rest), parent=ctx)
    except Exception as exc:  # typer's usage errors: the message is what the user would see
        if getattr(exc, "exit_code", None) == 0 and not hasattr(exc, "format_message"):
            return None  # --help, --version: an eager option that prints and exits 0
        message = getattr(exc, "format_message", lambda: str(exc))()
        return f"does not parse: {(message.splitlines() or [''])[0]}"
    profile = ctx.params.get("profile")
    if isinstance(profile, str) and not PLACEHOLDER.match(profile):
        from escha_deploy.utils.errors import EschaError
        from escha_deploy.profile import resolve_profile_path

        old = os.getcwd()
        try:
            os.chdir(cwd)
            resolve_profile_path(profile)
        except EschaError as exc:
            return f"--profile {profile}: {exc.message}"
        except OSError as exc:  # the folder it was printed in is gone
            return f"--profile {profile}: cannot check from {cwd}: {exc}"
        finally:
            os.chdir(old)
    return None


def problems() -> list[str]:
    """One line per recorded command that would not run as printed."""
    return sorted(set(BAD.values()))
