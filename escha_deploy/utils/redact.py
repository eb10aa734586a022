"""Secret redaction for everything escha-deploy prints about a launch.

SGLang 0.5.19 logs every server argument at startup, the API key included:
``sglang/srt/entrypoints/engine.py`` does ``logger.info(f"server_args={server_args.resolved_dict()}")``,
so the line reads ``[2026-11-29 16:20:00] server_args={'model_path': ..., 'api_key': 'sk-...',
'admin_api_key': None, ...}`` (a Python dict repr; older releases printed a dataclass repr,
``api_key='sk-...'``). ``Redactor`` masks

1. every known secret value, wherever it appears (the supervisor knows the values it passes);
2. the value of any secret-named field in those two reprs, even when the value is unknown
   (a key set some other way);
3. the value after a secret flag in a command line (``--api-key KEY``, ``--api-key=KEY``);
4. Hugging Face tokens (``hf_`` + 30 or more letters and digits) and ``Bearer`` credentials;
5. the unquoted value of a secret-named key, as a config file or an environment prints it
   (SGLang's ``--config`` YAML: ``api-key: KEY``; ``api_key=KEY``; ``SGLANG_API_KEY=KEY``),
   the credential after ``Authorization:`` (``Basic ...`` as well as ``Bearer ...``), a URL's
   user and password (``scheme://user:pass@host``) and a credential-named query parameter
   (``?api_key=KEY``, ``&token=KEY``);
6. keys by their shape, whatever names them (``secretargs.key_shaped``): an issuer's prefix
   anywhere (``sk-...``, a line that is only the key included; ``ghp_...``), the value of a
   credential-named pair (``token=KEY``, ``secret=``, ``session=``), every value of a cookie
   header (``Cookie: session=KEY; theme=x``, ``Set-Cookie: id=KEY; Path=/``, its attributes
   kept), and a generated-looking word after a key-like name (``key``, ``token``, ``secret``,
   ``auth``, ``session``, ``credential``, ``password`` in the name: ``X-Token KEY``,
   ``session_key: KEY``), so a count (``#new-token: 8192``) is left as it is.

``printable`` drops terminal control sequences (ANSI CSI and OSC escapes, other C0 and C1
control characters but tab) from a log line about to be printed: a log may carry an OSC
escape that retitles or rewrites the terminal reading it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from escha_deploy.utils.secretargs import PREFIXED_KEY_RE, generated, key_shaped
from escha_deploy.utils.termtext import printable  # noqa: F401 - the log printers' import

MASK = "***"

#: ServerArgs fields that carry secrets (sglang/srt/server_args.py, "API related" and SSL).
SECRET_FIELDS: tuple[str, ...] = ("api_key", "admin_api_key", "ssl_keyfile_password", "hf_token")

_FIELD_RE = re.compile(
    r"""(?P<head>['"]?(?:%s)['"]?\s*[:=]\s*)(?P<q>['"])(?P<val>(?:\\.|(?!(?P=q)).)*)(?P=q)"""
    % "|".join(SECRET_FIELDS)
)
#: A secret flag and its value in a printed command line (``--api-key KEY``, ``--api-key=KEY``);
#: the flags of ``escha_deploy.utils.secretargs.SECRET_FLAGS``.
_FLAG_RE = re.compile(r"(?P<head>--(?:api-key|admin-api-key|ssl-keyfile-password)(?:=|\s+))(?P<q>['\"]?)[^\s'\"]+")
_HF_TOKEN_RE = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{4,}")
#: An unquoted secret-named key and its value (``api-key: K``, ``api_key=K``, ``SGLANG_API_KEY=K``,
#: ``HF_TOKEN=K``); ``None``/``null`` (no key set) are left as they are.
_UNQUOTED_RE = re.compile(
    r"(?i)(?P<head>(?<![A-Za-z0-9])(?:admin[-_])?(?:api[-_]key|hf[-_]token|ssl[-_]keyfile[-_]password|"
    r"access[-_]token|secret[-_]key|password)\s*[:=]\s*)(?!(?:None|null|~)(?![^\s,;}\])]))(?P<val>[^\s'\",;}\])&#]+)")
#: ``Authorization: <scheme> <credential>`` (headers, curl -v, a dumped dict).
_AUTH_RE = re.compile(r"(?i)(?P<head>authorization['\"]?\s*[:=]\s*['\"]?(?:[A-Za-z]+\s+)?)(?P<val>[^\s'\",;}]+)")
#: A URL's user (and password): ``scheme://user:pass@host``.
_USERINFO_RE = re.compile(r"(?i)(?P<head>\b[a-z][a-z0-9+.-]*://)[^/@\s'\"]+@")
#: A credential-named query parameter.
_QUERY_RE = re.compile(r"(?i)(?P<head>[?&](?:api[-_]?key|key|token|access[-_]token|auth|password|secret)=)[^&#\s'\"]+")
#: A credential-named pair whose value is masked whatever it looks like (``token=KEY``,
#: ``auth_token=KEY``): the name alone or after a credential word, and ``=`` (``#new-token: 8192``,
#: a count, and ``eos_token=...`` are not one).
_PAIR_RE = re.compile(
    r"(?i)(?P<head>(?<![A-Za-z0-9.#_-])(?:(?:access|auth|refresh|id|bearer|session|api|csrf|xsrf|oauth|client)[-_])?"
    r"(?:token|secret|session|sessionid|session[-_]id|passwd|pwd|credentials?|apikey)\s*=\s*)(?!(?:None|null|~)(?![^\s,;}\])]))(?P<val>[^\s'\",;}\])&#]+)")
#: What an issuer's prefixed key starts with (``secretargs.PREFIXED_KEY_RE``), in a lower-cased
#: line: the full pattern runs only on a line that holds one.
_PREFIX_HINT_RE = re.compile(r"(?:sk|pk|rk|hf|gh[pousr]|github_pat|glpat|xox[a-z])[-_]")
#: A cookie header (``Cookie:``, ``Set-Cookie:``) up to the end of the line or a quote.
_COOKIE_RE = re.compile(r"(?i)(?P<head>\b(?:set-)?cookie['\"]?\s*[:=]\s*)(?P<val>[^'\"\n]*)")
_COOKIE_PAIR_RE = re.compile(r"(?P<name>[^=;\s]+)=(?P<val>[^;]*)")
#: Cookie attributes (RFC 6265, section 4.1.1), whose values are not secrets.
_COOKIE_ATTRS = frozenset({"path", "domain", "expires", "max-age", "samesite", "priority"})
#: A key-like name and the word after it (``:``, ``=`` or spaces between): masked when the word
#: is key-shaped (``secretargs.key_shaped``).
_NAMED_WORD_RE = re.compile(
    r"(?i)(?P<head>(?:key|token|secret|auth|session|credential|passw)[A-Za-z0-9_.-]*['\"]?"
    r"(?:\s*[:=]\s*|\s+)['\"]?)(?P<val>[^\s'\",;}\])&#]+)")
_PAIR_HINT_RE = re.compile(r"token|secret|session|passwd|pwd|credential|apikey")
_NAME_HINT_RE = re.compile(r"key|token|secret|auth|session|credential|passw")
#: Secret values shorter than this are not replaced literally (they would mask common words);
#: the field patterns still mask them where SGLang prints them.
MIN_LITERAL = 6


class Redactor:
    """Callable ``str -> str`` that masks secrets (see module docstring)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        vals = sorted({s for s in secrets if s and len(s) >= MIN_LITERAL}, key=len, reverse=True)
        self._literal = re.compile("|".join(re.escape(v) for v in vals)) if vals else None

    def __call__(self, text: str) -> str:
        if self._literal is not None:
            text = self._literal.sub(MASK, text)
        # each pattern only where its literal is (str.find is far cheaper than a failing regex
        # scan: a 64 MB log line took 3 s in _FIELD_RE alone)
        if any(name in text for name in SECRET_FIELDS):
            text = _FIELD_RE.sub(
                lambda m: m.group("head") + m.group("q") + (MASK if m.group("val") else "") + m.group("q"),
                text,
            )
        if "--" in text:
            text = _FLAG_RE.sub(lambda m: m.group("head") + m.group("q") + MASK, text)
        if "hf_" in text:
            text = _HF_TOKEN_RE.sub(MASK, text)
        low = text.lower()
        if any(w in low for w in ("key", "token", "password")):
            text = _UNQUOTED_RE.sub(lambda m: m.group("head") + MASK, text)
        if "authorization" in low:
            text = _AUTH_RE.sub(lambda m: m.group("head") + MASK, text)
        if "://" in text and "@" in text:
            text = _USERINFO_RE.sub(lambda m: m.group("head") + MASK + "@", text)
        if "=" in text and ("?" in text or "&" in text):
            text = _QUERY_RE.sub(lambda m: m.group("head") + MASK, text)
        text = _BEARER_RE.sub(lambda m: m.group(1) + MASK, text)
        return _by_shape(text, low)


def _by_shape(text: str, low: str) -> str:
    """Pattern 6 of the module docstring: keys by their shape. ``low``: ``text`` lower-cased
    (before the other patterns: the names it looks for are not masked by them)."""
    if _PREFIX_HINT_RE.search(low):
        text = PREFIXED_KEY_RE.sub(MASK, text)
    if "=" in text and _PAIR_HINT_RE.search(low):
        text = _PAIR_RE.sub(lambda m: m.group("head") + MASK, text)
    if "cookie" in low:
        text = _COOKIE_RE.sub(lambda m: m.group("head") + _COOKIE_PAIR_RE.sub(
            lambda c: c.group(0) if c.group("name").strip().lower() in _COOKIE_ATTRS
            else f"{c.group('name')}={MASK if c.group('val') else ''}", m.group("val")), text)
    # only a line holding a generated-looking run can hold such a word (a cheap test first: a
    # server's log is mostly lines that name tokens, with none)
    if _NAME_HINT_RE.search(low) and generated(text):
        text = _NAMED_WORD_RE.sub(
            lambda m: m.group("head") + (MASK if m.group("val") != MASK and key_shaped(m.group("val"))
                                         else m.group("val")), text)
    return text
