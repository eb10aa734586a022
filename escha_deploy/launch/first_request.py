"""The first request to a ready server: what to send (curl and the OpenAI client, printed by
`up` once it is ready and by `up --dry-run`), and `ask`, which sends one and prints the answer
with where its cached prompt tokens came from.

The request is SGLang's OpenAI-compatible chat route, ``POST /v1/chat/completions``
(``sglang/srt/entrypoints/http_server.py``: ``openai_v1_chat_completions``). The model name is
the server's served name: ``model.served_model_name``, else ``model.path``, as SGLang defaults
it (``server_args.py``: ``ServerArgs.__post_init__`` sets ``served_model_name = model_path``).
The API key (``container.api_key_file``) is never printed: the commands read it from its file
(``$(cat FILE)``, ``open(FILE)``), so a printed command holds no secret. ``ask`` asks for
``return_cached_tokens_details``, which SGLang answers in ``sglext.cached_tokens_details``
(``{"device": D, "host": H}``, ``output_streamer.py: get_cached_tokens_details``) when
something was cached; ``usage.prompt_tokens_details.cached_tokens`` is the total
(``usage_processor.py: _details_if_cached``, with ``--enable-cache-report``).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from escha_deploy.utils.errors import BadInput, Failed, Refused

#: The prompt the printed first request sends.
FIRST_PROMPT = "Say hello in five words."
#: Tokens the first request asks for at most.
FIRST_MAX_TOKENS = 64
#: Seconds `ask` waits for the answer (a first request after start may compile kernels).
ASK_TIMEOUT_S = 300.0


def served_model_name(model_path: str, served: str | None) -> str:
    """The name the server answers to: ``served`` (``--served-model-name``), else the model
    path, as SGLang 0.5.19 defaults it."""
    return served or model_path


def chat_body(model: str, prompt: str, max_tokens: int, *, cache_details: bool = False) -> dict:
    """The JSON body of one chat completion (``ChatCompletionRequest`` fields of
    ``entrypoints/openai/protocol.py``; ``return_cached_tokens_details`` is SGLang's own)."""
    body: dict = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    if cache_details:
        body["return_cached_tokens_details"] = True
    return body


@dataclass(frozen=True)
class FirstRequest:
    """The first request, as a shell command (``curl``) and as Python (``openai``): neither holds
    the key, both read it from ``key_file`` when there is one."""

    endpoint: str
    model: str
    key_file: str | None
    curl: str
    python: str

    def lines(self) -> list[str]:
        """What `up` prints: a heading, the curl command, the Python lines."""
        return ["first request (curl):", f"  {self.curl}", "or with the OpenAI client (pip install openai):",
                *(f"  {ln}" for ln in self.python.splitlines())]


def first_request(endpoint: str, model: str, key_file: str | None, prompt: str = FIRST_PROMPT,
                  max_tokens: int = FIRST_MAX_TOKENS) -> FirstRequest:
    """The first request to ``endpoint`` (``http://HOST:PORT``) for ``model``, the key read from
    ``key_file`` (a host path; None: the server takes no key). Pure."""
    body = json.dumps(chat_body(model, prompt, max_tokens), separators=(",", ":"))
    parts = ["curl", "-sS", "--fail-with-body", f"{endpoint}/v1/chat/completions",
             "-H", "Content-Type: application/json"]
    cmd = shlex.join(parts)
    if key_file:
        # the key stays in its file: the shell reads it when the command runs
        cmd += f' -H "Authorization: Bearer $(cat {shlex.quote(key_file)})"'
    cmd += f" -d {shlex.quote(body)}"
    key = f"open({key_file!r}).read().strip()" if key_file else '"EMPTY"'  # the client wants some key
    py = "\n".join([
        "from openai import OpenAI",
        f"client = OpenAI(base_url={endpoint + '/v1'!r}, api_key={key})",
        f"r = client.chat.completions.create(model={model!r}, max_tokens={max_tokens},",
        f"                                   messages=[{{'role': 'user', 'content': {prompt!r}}}])",
        "print(r.choices[0].message.content)",
    ])
    return FirstRequest(endpoint, model, key_file, cmd, py)


@dataclass(frozen=True)
class Answer:
    """What `ask` got back: the text, the prompt's tokens, and the cached ones: ``cached_tokens``
    the total (usage), ``device_tokens``/``host_tokens`` where they came from (sglext); None
    where the server did not say (no cache report, or nothing cached)."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    device_tokens: int | None
    host_tokens: int | None

    def cache_line(self) -> str:
        """One line: how many prompt tokens came from the cache, and from which tier."""
        if self.cached_tokens is None and self.device_tokens is None and self.host_tokens is None:
            return (f"cached tokens: none reported of {self.prompt_tokens} prompt tokens (nothing cached yet, or "
                    "the server runs without --enable-cache-report)")
        total = self.cached_tokens if self.cached_tokens is not None else (self.device_tokens or 0) + (self.host_tokens or 0)
        where = ("sources not reported" if self.device_tokens is None and self.host_tokens is None
                 else f"device {self.device_tokens or 0}, host {self.host_tokens or 0}")
        return f"cached tokens: {total} of {self.prompt_tokens} prompt tokens ({where})"


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _dict(v) -> dict:
    """``v`` when it is a JSON object, else ``{}``: a field of the wrong type reads as absent."""
    return v if isinstance(v, dict) else {}


def parse_answer(data: object) -> Answer:
    """An ``Answer`` from a chat completion's JSON. Raises ``Failed`` (4) when it has no choice;
    a field of another type than SGLang's (``usage`` a number, ``message`` a list) reads as
    absent, never as a traceback."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise Failed("ask: the server's answer has no choices")
    assert isinstance(data, dict)
    msg = _dict(choices[0].get("message"))
    usage = _dict(data.get("usage"))
    details = _dict(usage.get("prompt_tokens_details"))
    ext = _dict(_dict(data.get("sglext")).get("cached_tokens_details"))
    content = msg.get("content")
    return Answer(text=content if isinstance(content, str) else "", prompt_tokens=_int(usage.get("prompt_tokens")),
                  completion_tokens=_int(usage.get("completion_tokens")),
                  cached_tokens=_int(details.get("cached_tokens")), device_tokens=_int(ext.get("device")),
                  host_tokens=_int(ext.get("host")))


def _page(text: str, api_key: str | None, mask) -> str:
    """An error page's start as one printable line (``termtext.shown``), the key masked; a page
    that quotes the key wrapped across a line break or spaces (which the mask cannot match)
    is not shown at all."""
    from escha_deploy.utils.termtext import shown

    if api_key and "".join(text.split()).count(api_key) > text.count(api_key):  # the key split by whitespace
        return "(not shown: it quotes the API key across a line break)"
    return shown(mask(" ".join(mask(text).split())), 300)


def ask(endpoint: str, prompt: str, *, model: str | None = None, api_key: str | None = None,
        max_tokens: int = FIRST_MAX_TOKENS, timeout_s: float = ASK_TIMEOUT_S) -> Answer:
    """Send ``prompt`` to ``endpoint`` as one chat completion and return the answer.

    ``model``: the served name (default: the first of the server's ``/v1/models``). Every read
    goes through ``httpread`` (identity encoding, one coding at most, the body cap, the bounded
    JSON reader, and ``timeout_s`` for the whole request: a server that trickles its answer
    cannot restart it). Raises ``Refused`` (3) when nothing answers at ``endpoint`` or it
    refuses the key (401), ``Failed`` (4) for any other HTTP error, an answer cut off, late,
    too large or malformed; the key never appears in a message."""
    from escha_deploy.utils import httpread
    from escha_deploy.utils.redact import Redactor

    mask = Redactor([api_key] if api_key else [])
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    policy = httpread.Policy(deadline_s=timeout_s)

    def call(method: str, path: str, body: dict | None = None) -> httpread.Answer:
        hdrs = {**headers, **({"Content-Type": "application/json"} if body is not None else {})}
        content = json.dumps(body).encode() if body is not None else None
        try:
            r = httpread.request(method, endpoint + path, policy=policy, headers=hdrs, content=content)
        except httpread.Unreachable as exc:
            raise Refused(f"ask: nothing answers at {endpoint} ({mask(exc.reason)})",
                          hint="`escha-deploy status` lists the running servers") from None
        except httpread.ReadFailed as exc:
            raise Failed(f"ask: {mask(str(exc))}") from None
        if r.status == 401:
            raise Refused(f"ask: {endpoint} refused the API key (HTTP 401)",
                          hint="pass --api-key-file with the server's key file")
        return r

    def json_of(r: httpread.Answer):
        try:
            return r.json()
        except httpread.BadAnswer as exc:
            raise Failed(f"ask: {mask(str(exc))}") from None

    if model is None:
        r = call("GET", "/v1/models")
        data = json_of(r) if r.status == 200 else {}
        listed = _dict(data).get("data")
        ids = [_dict(m).get("id") for m in listed] if isinstance(listed, list) else []
        model = next((i for i in ids if isinstance(i, str) and i), None)
        if model is None:
            raise Failed(f"ask: {endpoint}/v1/models names no model (HTTP {r.status})")
    r = call("POST", "/v1/chat/completions", chat_body(model, prompt, max_tokens, cache_details=True))
    if r.status != 200:
        raise Failed(f"ask: {endpoint}/v1/chat/completions answered HTTP {r.status}: {_page(r.text(), api_key, mask)}")
    return parse_answer(json_of(r))


def check_prompt(prompt: str) -> str:
    """The prompt, or ``BadInput`` (2) when it is empty."""
    if not prompt.strip():
        raise BadInput("ask: PROMPT is empty")
    return prompt


def endpoint_of(port_host_ip: str, port_host: int) -> str:
    """The URL this host reaches a server published on ``port_host_ip``:``port_host`` at (a
    wildcard or loopback bind is asked on 127.0.0.1; an IPv6 address bracketed), as `up` waits on it."""
    from escha_deploy.utils.netaddr import url

    return url("127.0.0.1" if port_host_ip in ("0.0.0.0", "127.0.0.1", "") else port_host_ip, port_host)


def for_profile(profile, endpoint: str) -> FirstRequest:
    """The first request to ``profile``'s server at ``endpoint``: its served model name and its
    ``container.api_key_file`` (a host path), never the key."""
    m = profile.model
    return first_request(endpoint, served_model_name(m.path, m.served_model_name), profile.container.api_key_file)
