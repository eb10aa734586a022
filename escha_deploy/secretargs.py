"""Secrets never travel as server flags: which SGLang flags carry one, and what to use instead.

SGLang 0.5.19 takes three secrets as plain flag values (``srt/server_args.py``
``ServerArgs.add_cli_args``, "API related" and SSL): ``--api-key``, ``--admin-api-key`` and
``--ssl-keyfile-password``. Anything on a command line is readable by every user of the host
(``ps``, ``/proc/PID/cmdline``), is kept by Docker (``docker inspect``: ``Args``, ``Config.Cmd``)
and is printed by ``up --dry-run``, ``serve --print`` and ``compose``. So a profile's
``runtime.extra_args`` may not carry them: the API key goes in ``container.api_key_file``
(mounted read-only, passed to SGLang through a private ``--config`` file), and the other two
have no route yet, so they are refused.

Also refused in ``extra_args``: a URL with a password in it (``scheme://user:pass@host``) and a
JSON value (``--hicache-storage-backend-extra-config``, ``--model-loader-extra-config``) with a
credential-named key. ``redact_argv`` masks the value after a secret flag, for printing argvs
that did not come from a profile.

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

#: SGLang 0.5.19 flags whose value is a secret -> what to do instead. A test checks this list
#: against every catalog flag whose name says key/password/secret/token-as-credential.
SECRET_FLAGS: dict[str, str] = {
    "--api-key": "set container.api_key_file to a file holding the key (mounted read-only, "
                 "passed through a private --config file)",
    "--admin-api-key": "escha-deploy has no file route for the admin key yet; leave it out "
                       "(the admin endpoints then need the API key)",
    "--ssl-keyfile-password": "escha-deploy has no file route for it yet; use an unencrypted key "
                              "file readable only by the server's user",
}

#: Non-secret flags that are prefixes of a secret flag (argparse would not expand them).
_EXACT_OK = {"--ssl-keyfile"}

_USERINFO_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:[^/@\s]*@")
_CREDENTIAL_KEY_RE = re.compile(r"(?i)(pass(word|wd)?|secret|token|api[_-]?key|access[_-]?key|credential|auth)")


def secret_flag(token: str) -> str | None:
    """The secret flag that ``token`` names (exactly, with ``=value``, or as an abbreviation
    argparse would expand, since SGLang's parser has ``allow_abbrev``), else None."""
    if not token.startswith("--") or len(token) < 4:
        return None
    name = token.split("=", 1)[0]
    if name in _EXACT_OK:
        return None
    for flag in SECRET_FLAGS:
        if flag == name or (len(name) >= 5 and flag.startswith(name)):
            return flag
    return None


def _json_credential_keys(value: str) -> list[str]:
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        return []
    found: list[str] = []
    stack = [data]
    while stack and len(found) < 5:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(k, str) and _CREDENTIAL_KEY_RE.search(k) and v not in (None, "", False):
                    found.append(k)
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return found


def extra_args_problems(args: Sequence[str]) -> list[str]:
    """One line per secret found in ``runtime.extra_args``, each naming the item and what to do
    instead; never the value itself. Empty when there is none."""
    out: list[str] = []
    for i, token in enumerate(args):
        if not isinstance(token, str):
            continue
        flag = secret_flag(token)
        if flag is not None:
            spelled = token.split("=", 1)[0]
            how = f"{spelled} (= {flag})" if spelled != flag else flag
            out.append(f"item {i}: {how} would put a secret on the server's command line, where ps, "
                       f"docker inspect and every printed argv show it: {SECRET_FLAGS[flag]}")
        elif _USERINFO_RE.search(token):
            out.append(f"item {i}: a URL with a password in it would be on the server's command line; "
                       "use a URL without user:password@")
        elif token.lstrip().startswith("{"):
            keys = _json_credential_keys(token)
            if keys:
                out.append(f"item {i}: JSON with credential keys {', '.join(sorted(set(keys)))} would be on "
                           "the server's command line; put them in the backend's own config file")
    return out


def redact_argv(argv: Iterable[str], mask: str = "***") -> list[str]:
    """``argv`` with the value of every secret flag masked (``--api-key X``, ``--api-key=X``)."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            out.append(mask)
            hide_next = False
            continue
        flag = secret_flag(token)
        if flag is not None and "=" in token:
            out.append(token.split("=", 1)[0] + "=" + mask)
        else:
            out.append(token)
            hide_next = flag is not None
    return out
