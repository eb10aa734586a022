"""Secrets never travel as server flags: which SGLang flags carry one, and what to use instead.

SGLang 0.5.19 takes three secrets as plain flag values (``srt/server_args.py``
``ServerArgs.add_cli_args``, "API related" and SSL): ``--api-key``, ``--admin-api-key`` and
``--ssl-keyfile-password``. Anything on a command line is readable by every user of the host
(``ps``, ``/proc/PID/cmdline``), is kept by Docker (``docker inspect``: ``Args``, ``Config.Cmd``)
and is printed by ``up --dry-run``, ``serve --print`` and ``compose``. So a profile's
``runtime.extra_args`` may not carry them: the API key goes in ``container.api_key_file``
(mounted read-only, passed to SGLang through a private ``--config`` file), and the other two
have no route yet, so they are refused.

Also refused in ``extra_args``: a URL with credentials in it (``scheme://user:pass@host``,
``scheme://KEY@host``, ``?token=KEY``) and a JSON value (``--hicache-storage-backend-extra-config``, ``--model-loader-extra-config``) with a
credential-named key. ``redact_argv`` masks the value after a secret flag, for printing argvs
that did not come from a profile.

Pure: no I/O.
"""

from __future__ import annotations

import functools
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
#: Any user part in a URL (``scheme://KEY@host``: a token as the user name is a credential too).
_ANY_USERINFO_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]+@")
_CREDENTIAL_KEY_RE = re.compile(r"(?i)(pass(word|wd)?|secret|token|api[_-]?key|access[_-]?key|credential|auth)")
#: A credential-named query parameter in a URL (``?token=K``, ``&api_key=K``).
_CREDENTIAL_QUERY_RE = re.compile(
    r"(?i)[A-Za-z][A-Za-z0-9+.-]*://[^\s]*[?&#](?:[A-Za-z0-9_.-]*(?:pass(?:word|wd)?|secret|token|key|credential|"
    r"auth|sig(?:nature)?)[A-Za-z0-9_.-]*)=")
#: Dash look-alikes a word processor or a chat client puts where ``--`` was typed: hyphen and
#: dash forms U+2010-U+2015, minus sign U+2212, small and full-width hyphen-minus.
_DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe63\uff0d"
#: Edits (Levenshtein distance) within which an unknown flag counts as a secret flag misspelt
#: (``--apikey``, ``--api-ky``); no flag of SGLang's parser is that close to one (a test checks).
MAX_EDITS = 2


def flag_name(token: str) -> str:
    """How ``token`` names a flag once typing accidents are undone: dash look-alikes at its
    start become ``-`` (one of them alone stands for ``--``), the name ends at ``=`` or
    whitespace (``"--api-key KEY"`` given as one item), lower case, ``_`` as ``-``."""
    t = token.strip()
    lead = len(t) - len(t.lstrip("-" + _DASHES))
    head = "".join("-" if c in _DASHES else c for c in t[:lead])
    if lead == 1 and t[0] in _DASHES:
        head = "--"
    name = re.split(r"[=\s]", head + t[lead:], maxsplit=1)[0]
    return name.lower().replace("_", "-")


def _edits(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[:], i
        for j, cb in enumerate(b, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
    return row[-1]


def secret_flag(token: str) -> str | None:
    """The secret flag that ``token`` names (exactly, with ``=value``, with a value after a
    space in the same item, as an abbreviation argparse would expand, since SGLang's parser has
    ``allow_abbrev``, with dash look-alikes, ``_`` or capitals, or misspelt within
    ``MAX_EDITS`` edits), else None. Kept per token (the last ``TOKENS_KEPT``): a profile's
    ``extra_args`` is checked at each load, the same flags again and again."""
    if not isinstance(token, str):
        return None
    return _secret_flag(token)


#: How many tokens ``secret_flag`` keeps its answer for.
TOKENS_KEPT = 4096


@functools.lru_cache(maxsize=TOKENS_KEPT)
def _secret_flag(token: str) -> str | None:
    name = flag_name(token)
    if not name.startswith("--") or len(name) < 4 or name in _EXACT_OK:
        return None
    for flag in SECRET_FLAGS:
        if flag == name or (len(name) >= 5 and flag.startswith(name)):
            return flag
    for flag in SECRET_FLAGS:
        # the length difference is a lower bound of the edit distance: a far longer or shorter
        # name is not a misspelling, and its distance is not computed
        if len(name) >= 7 and abs(len(name) - len(flag)) <= MAX_EDITS and _edits(name, flag) <= MAX_EDITS:
            return flag
    return None


#: A key as its issuer prints it, by its prefix: OpenAI's ``sk-`` (``sk-proj-``), publishable and
#: restricted ``pk-``/``rk-``, Hugging Face's ``hf_``, GitHub's ``ghp_`` ``gho_`` ``ghu_`` ``ghs_``
#: ``ghr_`` ``github_pat_``, GitLab's ``glpat-``, Slack's ``xoxb-`` ...; at least 10 characters
#: after the prefix, up to a separator (space, quote, ``,;:/?#&=``, brackets).
_PREFIXED = r"(?:sk|pk|rk|hf|ghp|gho|ghu|ghs|ghr|github_pat|glpat|xox[abeoprs])[-_][^\s'\"`,;:/?#&=<>(){}\[\]|\\]{10,}"
PREFIXED_KEY_RE = re.compile(r"(?<![A-Za-z0-9_-])" + _PREFIXED)
#: A run of letters and digits inside a word (between ``-_.~+/=``): where a generated key shows.
_RUN_RE = re.compile(r"[A-Za-z0-9]{12,}")
#: Letter-digit switches in one run from which it reads as generated, not written (a random
#: base62 run of 12 has about 6; ``Qwen3_5ForCausalLM2024``'s longest run has 2).
MIN_SWITCHES = 4


def generated(word: str) -> bool:
    """Whether ``word`` holds a run that reads as generated rather than written: 12 or more
    letters and digits with ``MIN_SWITCHES`` letter-digit switches (``a8F3kQ9zL2mN``, a hex
    digest) — a key's shape, where a model name, a version or a snake_case name has none."""
    for run in _RUN_RE.findall(word):
        switches = sum(a.isdigit() != b.isdigit() for a, b in zip(run, run[1:]))
        if switches >= MIN_SWITCHES:
            return True
    return False


def key_shaped(word: str) -> bool:
    """Whether ``word`` (no spaces) has a key's shape: an issuer's prefix (``PREFIXED_KEY_RE``:
    ``sk-...``, ``hf_...``, ``ghp_...``) or a generated run (``generated``)."""
    return bool(PREFIXED_KEY_RE.search(word)) or generated(word)


def url_credential(token: str) -> str | None:
    """What credential a URL in ``token`` carries (``"user:password@ or KEY@"``, ``"a
    credential query parameter: ..."``, ``"a key in its path, query or fragment"``), else None:
    refused in every URL-taking flag (the catalog's ``--otlp-traces-endpoint``,
    ``--load-publish-endpoint``, ...) and anywhere else in ``runtime.extra_args``, since the argv
    is printed. A key in the path (``http://host:4317/KEY``) or the fragment (``/#KEY``) is
    known by its shape (``key_shaped``), as no name says what it is."""
    if "://" not in token:
        return None
    if _ANY_USERINFO_RE.search(token):
        return "user:password@ or KEY@"
    if _CREDENTIAL_QUERY_RE.search(token):
        return "a credential query parameter: ?token=, ?api_key=, ..."
    for url in re.findall(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", token):
        rest = url.split("://", 1)[1]
        cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
        if any(key_shaped(part) for part in re.split(r"[/?#&=;]", rest[cut:]) if part):
            return "a key-shaped part in its path, query or fragment"
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
            spelled = re.split(r"[=\s]", token.strip(), maxsplit=1)[0][:40]  # never the value
            how = f"{spelled} (= {flag})" if spelled != flag else flag
            out.append(f"item {i}: {how} would put a secret on the server's command line, where ps, "
                       f"docker inspect and every printed argv show it: {SECRET_FLAGS[flag]}")
        elif (what := url_credential(token)) is not None:
            out.append(f"item {i}: a URL with a password in it ({what}) would be on the server's command line "
                       "and in every printed argv, compose file and manifest; use a URL without credentials")
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
        if flag is not None and re.search(r"[=\s]", token.strip()):
            out.append(re.split(r"([=\s])", token.strip(), maxsplit=1)[0] + "=" + mask)
        else:
            out.append(token)
            hide_next = flag is not None
    return out
