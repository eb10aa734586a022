"""The one family of user-facing errors, and the exit codes shared by every command.

Exit codes: 0 success; 1 an internal error escha-deploy caught in its own code and names
(``Internal``: "please report", its traceback in a log; the exit code of an uncaught Python
exception, which it is in all but the message); 2 bad input or usage (matches Click's usage
error); 3 refused before starting or not satisfied (unsafe plan, missing capability, failed
preflight, inventory drift, canary mismatch, ``status``/``logs`` with nothing running);
4 started but failed (server crash, ready timeout); 5 inconclusive.

Only these classes are mapped to exit codes by the CLI; any other exception is a bug and keeps
its traceback. ``ESCHA_DEBUG=1`` shows tracebacks for these too.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL = 1
    BAD_INPUT = 2
    REFUSED = 3
    FAILED = 4
    INCONCLUSIVE = 5


#: Everything ``str.splitlines`` breaks at (\r, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029 and \n):
#: a value quoted from user input must not start a new line of its own.
_LINE_BREAKS = str.maketrans({c: " " for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def _one_line(text: str) -> str:
    return str(text).translate(_LINE_BREAKS)


class EschaError(Exception):
    """A user-facing failure: one line per problem, each naming a field or a file:line.

    ``problems`` holds the lines; ``message`` is the first. ``hint`` is printed after them as
    the next thing to do. Subclasses fix the exit code.
    """

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, *problems: str, hint: str | None = None) -> None:
        if not problems:
            raise TypeError("EschaError needs at least one problem line")
        self.problems: tuple[str, ...] = tuple(_one_line(p) for p in problems)
        self.hint = _one_line(hint) if hint is not None else None
        super().__init__(self.problems[0])

    @property
    def message(self) -> str:
        return self.problems[0]

    def lines(self) -> list[str]:
        out = [f"error: {p}" for p in self.problems]
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


class BadInput(EschaError):
    """Bad input or usage: a malformed profile, an unknown key, a bad unit. Exit 2."""

    exit_code = ExitCode.BAD_INPUT


class Refused(EschaError):
    """Refused before anything started, or a check not satisfied. Exit 3."""

    exit_code = ExitCode.REFUSED


class Failed(EschaError):
    """Started but failed: a server crash, a ready timeout. Exit 4."""

    exit_code = ExitCode.FAILED


class Inconclusive(EschaError):
    """A check that could not prove its result (a canary without a host-tier hit). Exit 5."""

    exit_code = ExitCode.INCONCLUSIVE


class Internal(EschaError):
    """A fault in escha-deploy's own code, caught where it can be told from the user's input
    (SGLang's pre-flight harness: ``launch.sglang_preflight.raised_by_sglang``). Exit 1, as an
    uncaught exception's; its line says "please report" and where the traceback is, and names no
    profile key, since no key caused it."""

    exit_code = ExitCode.INTERNAL
