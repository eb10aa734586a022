"""Text from outside about to reach a terminal: ``printable`` drops its control sequences.

A server's answer, a log line, a state file's field may carry an OSC escape that retitles or
rewrites the terminal reading it (``ESC ] 0 ; TITLE BEL``), a CSI colour or cursor move
(``ESC [ 31 m``), or a bare C0/C1 control character. ``printable`` removes each of them, so what
is printed is the text and nothing the terminal would act on. It removes the Unicode bidirectional
controls as well (the embeddings and overrides U+202A-202E, the isolates U+2066-2069, the marks
U+200E, U+200F and U+061C; Unicode Standard Annex #9, section 2): they reorder what a terminal
shows, so a file name or a key could read as another ("Trojan Source", CVE-2021-42574).
"""

from __future__ import annotations

import re

#: Terminal control sequences: OSC (ESC ] ... BEL or ESC \\), CSI (ESC [ ... final byte), other
#: two-byte ESC sequences, their one-byte C1 forms (CSI 0x9B, OSC 0x9D), and every other C0/C1
#: control character but tab (ECMA-48, sections 5.3 to 5.6: the C0 set 0x00-0x1F, DEL 0x7F, the
#: C1 set 0x80-0x9F); and the bidi controls (see the module docstring).
CONTROL_RE = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b\[[0-?]*[ -/]*[@-~]?|\x1b[@-_]?"
                        r"|\x9d[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?|\x9b[0-?]*[ -/]*[@-~]?"
                        r"|[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The same, a line feed kept (a message of several lines, each printed as its own line).
_CONTROL_NOT_LF_RE = re.compile(CONTROL_RE.pattern.replace("\\x0a-\\x1f", "\\x0b-\\x1f"))


def printable(line: str, *, newlines: bool = False) -> str:
    """``line`` without terminal control sequences or bidi controls (see the module
    docstring), for printing; tab is kept, and line feeds where ``newlines`` is true."""
    pattern = _CONTROL_NOT_LF_RE if newlines else CONTROL_RE
    return pattern.sub("", line) if pattern.search(line) else line


def shown(text: str, limit: int = 200) -> str:
    """``text`` as one printable line of at most ``limit`` characters (``...`` marks a cut)."""
    out = printable(str(text).replace("\n", " ").replace("\t", " "))
    return out if len(out) <= limit else out[: limit - 3] + "..."
