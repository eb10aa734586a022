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
   ``session_key: KEY``), so a count (``#new-token: 8192``) is left as it is;
7. tokens whose shape is their issuer's: AWS access key ids (``AKIA``/``ASIA`` + 16), JWTs
   (``eyJ...``, three base64url parts), Google ``AIza...`` keys, a PEM private key's body (on
   one line, a JSON string with ``\\n`` escapes included, or over the lines a caller passes one by
   one), a Slack webhook's path, ``mysql -pPW``, a ``.netrc`` password, and the password of a
   schemeless ``user:pass@host``. An image digest (``name:tag@sha256:...``), a hash, a path and
   the shell's ``PWD=/path`` are left as they are.

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
#: A secret-named key and its value (``api-key: K``, ``api_key=K``, ``SGLANG_API_KEY=K``,
#: ``HF_TOKEN=K``, ``PGPASSWORD=K``, ``MYSQL_PWD=K``, AWS's ``aws_secret_access_key = K`` and
#: ``"SessionToken": "K"``, ``X-Amz-Security-Token: K``, Azure's ``AccountKey=K``): the name may
#: follow a letter or ``_`` (``DB_PASSWORD``), a quote may close it before the separator (JSON's
#: ``"password": "K"``, whose quoted value is masked whole, spaces included), and the separator
#: may be the fullwidth colon or equals sign (U+FF1A, U+FF1D). ``None``/``null`` (no key set)
#: are left as they are.
_SECRET_NAMES = (r"(?:admin[-_])?(?:api[-_]?key|hf[-_]token|ssl[-_]keyfile[-_]password|access[-_]?token|"
                 r"secret[-_]?(?:access[-_]?)?key|session[-_]?token|security[-_]?token|account[-_]?key|"
                 r"password|passwd|[-_]pwd)")
_UNQUOTED_RE = re.compile(
    r"(?i)(?P<head>" + _SECRET_NAMES + r"['\"]?\s*[:=\uff1a\uff1d]\s*)"
    r"(?:(?P<q>['\"])(?P<qval>[^'\"\n]*)(?P=q)"
    r"|(?!(?:None|null|~)(?![^\s,;}\])])|[{\[(])(?P<val>[^\s'\",;}\])&#]+))")
_UNQUOTED_HINTS = ("key", "token", "passw", "pwd")
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
#: AWS access key ids: ``AKIA`` (long-term) or ``ASIA`` (temporary) and 16 capitals and digits
#: (AWS IAM User Guide, "Unique identifiers", the ID prefixes table).
_AWS_ID_RE = re.compile(r"(?<![A-Za-z0-9])A(?:KI|SI)A[A-Z0-9]{16}(?![A-Za-z0-9])")
#: A JSON Web Token (RFC 7519, compact serialization, RFC 7515 section 7.1): three base64url
#: parts joined by dots, the header a JSON object (``{"`` encodes as ``eyJ``); an unsigned one
#: has an empty third part.
_JWT_RE = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")
#: A Google API key: ``AIza`` and 35 letters, digits, ``-`` and ``_``.
_GCP_KEY_RE = re.compile(r"(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{35}")
#: A PEM private key (RFC 7468): its body between the BEGIN and END lines, on one line (a JSON
#: string with ``\n`` escapes, as in a Google service-account file) or to the end of this one.
_PEM_BEGIN = r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
_PEM_END = r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----"
_PEM_RE = re.compile(r"(?P<head>" + _PEM_BEGIN + r")(?P<body>(?:(?!-----END ).)*)(?P<end>" + _PEM_END + r")?",
                     re.DOTALL)
_PEM_END_RE = re.compile(_PEM_END)
#: A PEM body line: base64 (RFC 7468, section 3: 64 characters a line, the last one shorter,
#: ``=`` padding), after whatever prefix a log gives each line; and the most such lines masked
#: after a BEGIN (an 8192-bit RSA key is about 100), so a BEGIN line alone never hides a log.
_PEM_BODY_LINE_RE = re.compile(r"(?:^|\s)(?:[A-Za-z0-9+/]{16,}={0,2}|[A-Za-z0-9+/]*={1,2})\s*$")
PEM_MAX_LINES = 200
#: A Slack incoming webhook's secret path (``https://hooks.slack.com/services/T.../B.../...``).
_SLACK_HOOK_RE = re.compile(r"(?i)(?P<head>hooks\.slack\.com/(?:services|workflows|triggers)/)[A-Za-z0-9/_-]+")
#: A MySQL/MariaDB client's password glued to ``-p`` (``mysql -u root -pPW``; with a space the
#: client prompts and the word is the database, MySQL Reference Manual, "--password").
_MYSQL_P_RE = re.compile(r"(?i)(?P<head>\b(?:mysql|mariadb)[a-z-]*\b[^\n]*?\s-p)(?P<val>[^\s'\"]+)")
#: A ``.netrc`` entry's password (``machine HOST login USER password PW``; GNU inetutils' netrc
#: tokens): a word after ``password`` on a line that names a machine or login.
_NETRC_RE = re.compile(r"(?i)(?P<head>\b(?:machine|default|login)\s[^\n]*?\bpassword\s+)(?P<val>[^\s'\"]+)")
#: ``user:password@host`` without a scheme (a DSN, ``psql``'s or ``redis-cli``'s argument): the
#: password masked, the user and host kept. Not an image's ``name:tag@sha256:`` digest.
_BARE_USERINFO_RE = re.compile(
    r"(?P<head>(?<![A-Za-z0-9._%+/:@-])[A-Za-z0-9._%+-]+:)(?P<val>[^\s@/:'\"]+)(?P<at>@)"
    r"(?!sha(?:1|224|256|384|512):)(?=[A-Za-z0-9\[])")
#: Secret values shorter than this are not replaced literally (they would mask common words);
#: the field patterns still mask them where SGLang prints them.
MIN_LITERAL = 6


class Redactor:
    """Callable ``str -> str`` that masks secrets (see module docstring)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        vals = sorted({s for s in secrets if s and len(s) >= MIN_LITERAL}, key=len, reverse=True)
        self._literal = re.compile("|".join(re.escape(v) for v in vals)) if vals else None
        #: Inside a PEM private key printed over several lines (called line by line), and the
        #: body lines masked so far
        self._in_pem = False
        self._pem_lines = 0

    def __call__(self, text: str) -> str:
        if self._in_pem:  # a body line of a private key begun on an earlier line
            end = _PEM_END_RE.search(text)
            if end is not None:
                self._in_pem = False
                text = MASK + text[end.start():]
            elif self._pem_lines < PEM_MAX_LINES and _PEM_BODY_LINE_RE.search(text):
                self._pem_lines += 1
                return MASK
            else:  # not a key's line (a BEGIN with no body, a log that went on): read as any line
                self._in_pem = False
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
        if any(w in low for w in _UNQUOTED_HINTS):
            text = _UNQUOTED_RE.sub(_masked_value, text)
        if "authorization" in low:
            text = _AUTH_RE.sub(lambda m: m.group("head") + MASK, text)
        if "://" in text and "@" in text:
            text = _USERINFO_RE.sub(lambda m: m.group("head") + MASK + "@", text)
        if "=" in text and ("?" in text or "&" in text):
            text = _QUERY_RE.sub(lambda m: m.group("head") + MASK, text)
        text = _BEARER_RE.sub(lambda m: m.group(1) + MASK, text)
        if "PRIVATE KEY-----" in text:
            text = _PEM_RE.sub(self._pem, text)
        return _by_shape(text, low)

    def _pem(self, m: re.Match[str]) -> str:
        if m.group("end") is None:  # the body goes on past this line
            self._in_pem, self._pem_lines = True, 0
        return m.group("head") + MASK + (m.group("end") or "")


#: The word a name ends (back to a space, quote, ``=``, ``,`` or bracket): a ``/`` in it makes
#: the name a path's part (``/etc/passwd: ...``, ``/run/secrets/api_key: no such file``).
_WORD_BEFORE_RE = re.compile(r"[^\s'\"=,;({\[]*$")


def _masked_value(m: re.Match[str]) -> str:
    """``_UNQUOTED_RE``'s match with its value masked (a quoted one inside its quotes); a name
    inside a path is not one, and its match is kept."""
    before = _WORD_BEFORE_RE.search(m.string, max(0, m.start() - 256), m.start())
    if before is not None and "/" in before.group():
        return m.group(0)
    q = m.group("q")
    if q is None:
        return m.group("head") + MASK
    val = m.group("qval")
    return m.group("head") + q + (MASK if val and val not in ("None", "null") else val) + q


def _pair_masked(m: re.Match[str]) -> str:
    """``_PAIR_RE``'s match with its value masked; but the shell's ``PWD=/path`` and
    ``OLDPWD=/path`` (POSIX, "Shell Variables") are the working folder, not a password."""
    if m.group("head").rstrip("= ").endswith("PWD") and m.group("val").startswith("/"):
        return m.group(0)
    return m.group("head") + MASK


def _by_shape(text: str, low: str) -> str:
    """Pattern 6 of the module docstring: keys by their shape. ``low``: ``text`` lower-cased
    (before the other patterns: the names it looks for are not masked by them)."""
    if _PREFIX_HINT_RE.search(low):
        text = PREFIXED_KEY_RE.sub(MASK, text)
    if "IA" in text:
        text = _AWS_ID_RE.sub(MASK, text)
    if "eyJ" in text:
        text = _JWT_RE.sub(MASK, text)
    if "AIza" in text:
        text = _GCP_KEY_RE.sub(MASK, text)
    if "hooks.slack" in low:
        text = _SLACK_HOOK_RE.sub(lambda m: m.group("head") + MASK, text)
    if "mysql" in low or "mariadb" in low:
        text = _MYSQL_P_RE.sub(lambda m: m.group("head") + MASK, text)
    if "password" in low:
        text = _NETRC_RE.sub(lambda m: m.group("head") + (m.group("val") if m.group("val") == MASK else MASK), text)
    if "@" in text and ":" in text:
        text = _BARE_USERINFO_RE.sub(lambda m: m.group("head") + MASK + m.group("at"), text)
    if "=" in text and _PAIR_HINT_RE.search(low):
        text = _PAIR_RE.sub(_pair_masked, text)
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
