"""Paths read from files we do not control, confined to the folder they are relative to.

A patch's ``+++ b/python/sglang/X``, a ``series`` line, an inventory's file names: each names
a file under one root (the sglang package, the series folder). Such a path is written by
whoever made the file, so before it is joined to the root it must stay under it. The rules are
git's own for the paths a tree may hold (``read-cache.c: verify_path``: no ``.`` or ``..``
component, no empty component, nothing absolute) plus NUL, which no file name on POSIX can
hold; a path that breaks one of them is refused, never repaired, so what is checked is what is
joined. Pure: no file system access (``patching.apply`` also checks each resolved target, for
a symbolic link inside the tree that points out of it).

Git C-quotes a path with unusual bytes (``"a/python/sglang/\\303\\251.py"``;
``quote.c: quote_c_style``); ``unquote_c`` reads that form back, so ``\\056\\056`` is checked
as the ``..`` it is.
"""

from __future__ import annotations

from escha_deploy.utils.errors import BadInput

#: git's one-letter escapes (``quote.c: sq_lookup`` / ``unquote_c_style``).
_C_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("t"): 9, ord("n"): 10, ord("v"): 11, ord("f"): 12,
              ord("r"): 13, ord('"'): 34, ord("\\"): 92}


def unquote_c(data: bytes, where: str) -> tuple[bytes, bytes]:
    """Read one C-quoted string at the start of ``data`` (which starts with ``"``), as git
    writes it: ``\\"``, ``\\\\``, ``\\a\\b\\t\\n\\v\\f\\r`` and three octal digits ``\\ooo``
    (one byte each). Returns ``(the unquoted bytes, what follows the closing quote)``.

    Raises ``BadInput`` (``where: ...``) for a string with no closing quote, an unknown escape
    (``\\x``: git writes none), or an octal escape above ``\\377``.
    """
    out = bytearray()
    i, n = 1, len(data)
    while i < n:
        c = data[i]
        if c == 0x22:  # the closing quote
            return bytes(out), data[i + 1:]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        if i + 1 >= n:
            break
        e = data[i + 1]
        if e in _C_ESCAPES:
            out.append(_C_ESCAPES[e])
            i += 2
        elif 0x30 <= e <= 0x33 and i + 3 < n and all(0x30 <= d <= 0x37 for d in data[i + 2:i + 4]):
            out.append(int(data[i + 1:i + 4], 8))
            i += 4
        else:
            shown = data[i:i + 2].decode("ascii", "backslashreplace")
            raise BadInput(f"{where}: quoted path has an escape git does not write ({shown!r}; "
                           "git writes \\\" \\\\ \\a \\b \\t \\n \\v \\f \\r and \\000-\\377)")
    raise BadInput(f"{where}: quoted path has no closing '\"'")


def decode_path(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text; ``BadInput`` naming ``where`` and the first bad byte otherwise
    (a file name the image's file system would store as other bytes than the inventory says)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{where}: path is not UTF-8 (byte 0x{data[exc.start]:02x} at offset "
                       f"{exc.start})") from None


def confine(path: str, where: str, root: str) -> str:
    """``path`` unchanged when it is a relative path that stays under ``root`` (the folder it
    will be joined to, named in the message); else ``BadInput`` ``where: path '...' ...`` with
    the reason: absolute, a ``..`` or ``.`` part, an empty part (``a//b``, a trailing ``/``), a
    NUL byte, or empty. ``where`` is ``file:line`` (or ``file: key``)."""
    if not path:
        reason = "is empty"
    elif "\0" in path:
        reason = "holds a NUL byte"
    elif path.startswith("/"):
        reason = f"is absolute; it must be relative to {root}"
    else:
        parts = path.split("/")
        if ".." in parts:
            reason = f"has a '..' part and would leave {root}"
        elif "" in parts:
            reason = "has an empty part ('//' or a trailing '/')"
        elif "." in parts:
            reason = "has a '.' part"
        else:
            return path
    raise BadInput(f"{where}: path {path!r} {reason}")
