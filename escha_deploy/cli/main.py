"""Console entry point: run the Typer app and map escha's own errors to exit codes.

Only ``EschaError`` subclasses are mapped (one line per problem on stderr, exit code from
``errors.ExitCode``), and typer's usage errors (one ``error:`` line and a ``--help`` hint, exit
2); any other exception is a bug and keeps its traceback. ``ESCHA_DEBUG=1``
shows the traceback for escha's errors too.
"""

from __future__ import annotations

import os
import re
import sys


def main(argv: list[str] | None = None) -> int:
    from escha_deploy.utils.errors import EschaError

    from .app import build_app

    import typer

    args = sys.argv[1:] if argv is None else argv
    app = build_app(args[0] if args and not args[0].startswith("-") else None)
    stdout = sys.stdout
    sys.stdout = _ReaderMayClose(stdout)
    try:
        # not standalone: usage errors come back here and print as one line, like ours
        rv = app(args=argv, prog_name="escha-deploy", standalone_mode=False)
    except EschaError as exc:
        if os.environ.get("ESCHA_DEBUG") == "1":
            import traceback

            traceback.print_exc()
        from escha_deploy.utils.termtext import printable

        for line in exc.lines():  # a line may quote a file's key or a server's words
            print(printable(line, newlines=True), file=sys.stderr)
        sys.exit(int(exc.exit_code))
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except typer.TyperException as exc:  # typer's usage and parameter errors (exit 2)
        message = exc.format_message()
        if "\n" in message:  # `escha-deploy` alone: the help text, as before
            exc.show()
        else:
            from escha_deploy.utils.termtext import printable

            print(f"error: {printable(message)}", file=sys.stderr)
            ctx = getattr(exc, "ctx", None)
            print(_profile_hint(ctx, message) or _set_hint(ctx, message, args)
                  or f"hint: see `{ctx.command_path if ctx else 'escha-deploy'} --help`", file=sys.stderr)
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - only docker-py's own family is answered here
        # a Docker API error (the daemon answered 500, a container removed meanwhile) that no
        # command turned into its own words: one line and exit 3, never docker-py's traceback
        if not ((mod := type(exc).__module__ or "") == "docker" or mod.startswith("docker.")):
            raise
        from escha_deploy.launch.docker import daemon_refusal

        for line in daemon_refusal(exc, (args[0] if args and not args[0].startswith("-") else "escha-deploy")).lines():
            print(line, file=sys.stderr)
        sys.exit(3)
    finally:
        sys.stdout.flush()  # through the wrapper: a closed pipe is noticed here, not at exit
        sys.stdout = stdout
    if isinstance(rv, int) and rv:
        sys.exit(rv)
    return 0


class _ReaderMayClose:
    """``sys.stdout`` while a command runs. When the reader closes the pipe early
    (``escha-deploy plan | head -1``), the rest of the output is dropped and the command ends
    with its own exit code (0, or 3 for an unsafe plan), instead of Python's ``BrokenPipeError``
    and exit 1. The descriptor is pointed at /dev/null so the interpreter's last flush does not
    fail (docs.python.org/3/library/signal.html, "Note on SIGPIPE")."""

    def __init__(self, stream):
        self._stream = stream
        self._closed = False

    def write(self, text: str) -> int:
        if not self._closed:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self._closed:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self._closed = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture): nothing to point
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


#: click's message for words left over after the parameters (``click.core.Command.parse_args``).
_EXTRA_ARGS = re.compile(r"^Got unexpected extra argument(?:s|\(s\))? \((.*)\)$")


def _profile_hint(ctx, message: str) -> str | None:
    """``hint: did you mean `--profile NAME`?`` when a command that takes ``--profile`` got a
    profile (a shipped name or a profile file) as a positional argument; else ``None``."""
    m = _EXTRA_ARGS.match(message)
    command = getattr(ctx, "command", None)
    if m is None or command is None or not any(
            "--profile" in getattr(p, "opts", ()) for p in command.params):
        return None
    from escha_deploy.profile import list_profiles, names_a_file

    shipped = set(list_profiles())
    for word in m.group(1).split(" "):
        if word in shipped or (names_a_file(word) and os.path.isfile(word)):
            return f"hint: did you mean `--profile {word}`?"
    return None


#: click's message for an option the command does not have (``click.parser``: "No such option").
_NO_SUCH_OPTION = re.compile(r"^No such option: (--[A-Za-z0-9][A-Za-z0-9-]*)")


def _set_hint(ctx, message: str, args: list[str]) -> str | None:
    """``hint: --hicache-ratio is SGLang's flag of the profile key hicache.hicache_ratio: pass
    `--set hicache.hicache_ratio=2``` when a command that takes ``--set`` got an SGLang flag that
    a profile key sets (``SGLangFlag`` metadata, ``profile.models.key_metadata``); the value is
    the one typed after the flag (``VALUE`` when none). Else ``None``."""
    m = _NO_SUCH_OPTION.match(message)
    command = getattr(ctx, "command", None)
    if m is None or command is None or not any("--set" in getattr(p, "opts", ()) for p in command.params):
        return None
    from escha_deploy.profile.models import key_metadata

    flag = m.group(1)
    keys = sorted(k for k, meta in key_metadata().items() if meta.flag == flag and not meta.secret)
    if len(keys) != 1:
        return None
    value = "VALUE"
    for i, word in enumerate(args):
        if word == flag and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return f"hint: {flag} is SGLang's flag of the profile key {keys[0]}: pass `--set {keys[0]}={value}`"


if __name__ == "__main__":  # pragma: no cover
    main()
