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
   (``?api_key=KEY``, ``&token=KEY``).

``printable`` drops terminal control sequences (ANSI CSI and OSC escapes, other C0 and C1
control characters but tab) from a log line about to be printed: a log may carry an OSC
escape that retitles or rewrites the terminal reading it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from escha_deploy.termtext import printable  # noqa: F401 - the log printers' import

MASK = "***"

#: ServerArgs fields that carry secrets (sglang/srt/server_args.py, "API related" and SSL).
SECRET_FIELDS: tuple[str, ...] = ("api_key", "admin_api_key", "ssl_keyfile_password", "hf_token")

_FIELD_RE = re.compile(
    r"""(?P<head>['"]?(?:%s)['"]?\s*[:=]\s*)(?P<q>['"])(?P<val>(?:\\.|(?!(?P=q)).)*)(?P=q)"""
    % "|".join(SECRET_FIELDS)
)
#: A secret flag and its value in a printed command line (``--api-key KEY``, ``--api-key=KEY``);
#: the flags of ``escha_deploy.secretargs.SECRET_FLAGS``.
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
        return _BEARER_RE.sub(lambda m: m.group(1) + MASK, text)
