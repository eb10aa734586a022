"""Text from outside about to reach a terminal: ``printable`` drops its control sequences.

A server's answer, a log line, a state file's field may carry an OSC escape that retitles or
rewrites the terminal reading it (``ESC ] 0 ; TITLE BEL``), a CSI colour or cursor move
(``ESC [ 31 m``), or a bare C0/C1 control character. ``printable`` removes each of them, so what
is printed is the text and nothing the terminal would act on.
"""

from __future__ import annotations

import re

#: Terminal control sequences: OSC (ESC ] ... BEL or ESC \\), CSI (ESC [ ... final byte), other
#: two-byte ESC sequences, and every other C0/C1 control character but tab (ECMA-48, sections
#: 5.3 to 5.6: the C0 set 0x00-0x1F, DEL 0x7F, the C1 set 0x80-0x9F).
CONTROL_RE = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b\[[0-?]*[ -/]*[@-~]?|\x1b[@-_]?"
                        r"|[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(line: str) -> str:
    """``line`` without terminal control sequences (see the module docstring), for printing."""
    return CONTROL_RE.sub("", line) if CONTROL_RE.search(line) else line


def shown(text: str, limit: int = 200) -> str:
    """``text`` as one printable line of at most ``limit`` characters (``...`` marks a cut)."""
    out = printable(str(text).replace("\n", " ").replace("\t", " "))
    return out if len(out) <= limit else out[: limit - 3] + "..."
