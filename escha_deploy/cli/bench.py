"""``escha-deploy bench`` (HiCache on/off benchmark) and ``escha-deploy canary`` (host-tier
restore check). Results on stdout (table or ``--format json``), progress on stderr.

Exit codes: bench 0 when it measured, 2 bad input, 3 endpoint not
reachable or no launcher, 4 a request failed; canary 0 pass, 3 mismatch, 5 inconclusive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import FormatOpt, OutputFormat, number_option

BENCH_EXAMPLES = """
Examples:

  escha-deploy bench --endpoint http://127.0.0.1:30000

  escha-deploy bench -e http://127.0.0.1:30000 --compare http://127.0.0.1:30001 --chart bench.png

  escha-deploy bench --hicache-ab --profile rtx5060ti-tp2-fp8 --format json
"""

CANARY_EXAMPLES = """
Examples:

  escha-deploy canary --endpoint http://127.0.0.1:30000

  escha-deploy canary -e http://127.0.0.1:30000 --fill-tokens 250000 --format json
"""

EndpointOpt = Annotated[
    Optional[str],
    typer.Option("--endpoint", "-e", help="Base URL of an SGLang server, e.g. http://127.0.0.1:30000."),
]
SeedOpt = Annotated[int, typer.Option("--seed", parser=number_option(integer=True), help="Seed of the generated prompts; the same seed gives the same tokens.")]
TimeoutOpt = Annotated[float, typer.Option(
    "--request-timeout", parser=number_option(1, 86400),
    help="Seconds one completion may take in all, from sending it to its last byte (not per byte); the "
    "small requests (/health, /server_info, /v1/tokenize, /metrics) take 30 s at most.")]
MaxReqOpt = Annotated[int, typer.Option("--max-requests", help="Refuse to send more requests than this.", parser=number_option(1, integer=True))]
ApiKeyOpt = Annotated[
    Optional[str],
    # Hidden: this option exists to read ESCHA_API_KEY and to refuse a key typed on the command
    # line with a reason and the two ways that work (SGLang's and OpenAI clients' habit is
    # --api-key KEY); --help offers only what works.
    typer.Option("--api-key", envvar="ESCHA_API_KEY", show_default=False, hidden=True,
                 help="Refused: a key typed here is seen by every user of the host (ps); use "
                 "--api-key-file or ESCHA_API_KEY."),
]
ApiKeyFileOpt = Annotated[
    Optional[Path],
    typer.Option("--api-key-file", show_default=False,
                 help="File whose first line is the bearer token, if the server has an API key (e.g. the "
                 "profile's container.api_key_file); or set ESCHA_API_KEY. Never printed."),
]


def _api_key(ctx: typer.Context, value: str | None, file: Path | None) -> str | None:
    """The bearer token from ESCHA_API_KEY or --api-key-file; ``BadInput`` for a key given on
    the command line (``/proc/PID/cmdline`` is readable by every user, and shells keep history)."""
    from escha_deploy.utils.errors import BadInput

    source = ctx.get_parameter_source("api_key")
    if value is not None and source is not None and source.name == "COMMANDLINE":
        raise BadInput("--api-key: a key on the command line is visible to every user of this host "
                       "(ps, /proc/PID/cmdline) and stays in shell history",
                       hint="put it in a file and pass --api-key-file FILE, or set ESCHA_API_KEY")
    if file is not None:
        if value:
            raise BadInput("--api-key-file and ESCHA_API_KEY: give one of them")
        from escha_deploy.launch.prepare import read_secret

        key = read_secret(str(file), "--api-key-file")  # control bytes refused by offset there
        _header_safe(key, f"--api-key-file {file}")
        return key
    if value is not None:
        from escha_deploy.launch.prepare import secret_control_problem

        if (bad := secret_control_problem(value, "ESCHA_API_KEY")) is not None:
            raise BadInput(bad.replace("(one trailing newline, LF or CRLF, is fine in a file: a file saved on "
                                       "Windows ends in CRLF)", "(no newline: export ESCHA_API_KEY=\"$(cat FILE)\" "
                                       "drops a trailing one; or pass --api-key-file FILE)"))
        _header_safe(value, "ESCHA_API_KEY")
    return value


def _header_safe(key: str, where: str) -> None:
    """An HTTP header value is Latin-1 text without line breaks (RFC 9110 section 5.5; httpx
    encodes it as ASCII): refuse any other key in one line that never shows it."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.httpread import header_safe

    if not header_safe(key):
        raise BadInput(f"{where}: the key holds a character that cannot go in an HTTP header "
                       "(only printable ASCII); the key is not shown")


def _tokens(value: str, name: str) -> int:
    """"18K" -> 18000, "1.5K" -> 1500, "18000" -> 18000 (K = 1000 tokens). The number is read by
    ``units.parse_number``, the one strict reading of every numeric option (a whole number
    without K; no ``1_5``, ``0x10``, ``inf``, ``nan``). Raises ``BadInput`` naming ``name``."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.units import parse_number

    v = value.strip()
    kilo = v[-1:] in ("k", "K")
    try:
        n = int(parse_number(v[:-1]) * 1000) if kilo else int(parse_number(v, integer=True))
    except ValueError as exc:
        raise BadInput(f"{name}: expected a token count such as 18K or 18000, got {value[:40]!r}: {exc}") from None
    if n < 1:
        raise BadInput(f"{name}: must be at least 1 token (got {value[:40]!r})")
    if n > MAX_TOKENS:
        raise BadInput(f"{name}: at most {MAX_TOKENS:,} tokens (got {value[:40]!r})")
    return n


#: Most tokens any prompt here may ask for: ten times the longest context SGLang 0.5.19's
#: model configs declare (1M).
MAX_TOKENS = 10_000_000


def check_endpoint(url: str, name: str = "--endpoint") -> str:
    """A base URL as ``http(s)://HOST[:PORT][/path]``; ``BadInput`` naming ``name`` otherwise.

    Refuses a password in the URL (it would be printed in every progress and error line; pass
    the key with --api-key-file or ESCHA_API_KEY), a port outside 1-65535, no host, spaces."""
    import re

    import httpx

    from escha_deploy.utils.errors import BadInput

    shown = _shown_url(url)
    if len(url) > 2048 or any(c.isspace() for c in url):
        raise BadInput(f"{name}: not a URL: {shown!r}")
    try:
        u = httpx.URL(url)
        port = u.port
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise BadInput(f"{name}: not a URL ({exc}): {shown!r}") from None
    if u.userinfo:
        raise BadInput(f"{name}: the URL carries a user or password, which would be printed; "
                       "drop user:password@ and pass the key with --api-key-file or ESCHA_API_KEY")
    if u.query or u.fragment or "?" in url or "#" in url:
        raise BadInput(f"{name}: a base URL takes no query (?...) or fragment (#...), which would be printed "
                       f"in every line (got {shown!r}); pass a key with --api-key-file or ESCHA_API_KEY")
    if u.scheme not in ("http", "https") or not u.host:
        # HOST:PORT without a scheme parses as scheme HOST: say the URL it would be
        bare = "://" not in url and re.fullmatch(r"[A-Za-z0-9.\-]+:[0-9]{1,5}(/.*)?|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}(/.*)?", url)
        raise BadInput(f"{name}: expected http://HOST:PORT, got {shown!r}",
                       hint=f"with its scheme: `{name} http://{url}`" if bare else None)
    if port is not None and not 0 < port < 65536:
        raise BadInput(f"{name}: port {port} is outside 1-65535")
    return url


def _shown_url(url: str) -> str:
    """A URL as error lines show it: without its user and password, query and fragment (each
    may hold a key), at most 80 characters."""
    import re

    cut = re.split(r"[?#\s]", url, maxsplit=1)[0]
    cut = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1***@", cut)
    cut += "..." if cut != url else ""
    return cut if len(cut) <= 80 else cut[:77] + "..."


class _Steps:
    """Progress on stderr: one rich spinner line per step, or plain lines when not a TTY."""

    def __init__(self, verb: str) -> None:
        from .output import stderr_console

        self.verb = verb
        self.console = stderr_console()
        self.status = None

    def __call__(self, label: str) -> None:
        if self.console.is_terminal:
            if self.status is None:
                self.status = self.console.status(label)
                self.status.start()
            else:
                self.status.update(label)
        else:
            self.console.print(f"{self.verb}: {label}", markup=False, highlight=False)

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def register(app: typer.Typer) -> None:
    from .app import PANEL_MEASURE

    @app.command("bench", rich_help_panel=PANEL_MEASURE, epilog=BENCH_EXAMPLES)
    def bench(
        ctx: typer.Context,
        endpoint: EndpointOpt = None,
        compare: Annotated[Optional[str], typer.Option(
            "--compare", help="A second server's URL; the table shows both side by side "
            "(labelled off/on from each server's /server_info).")] = None,
        hicache_ab: Annotated[bool, typer.Option(
            "--hicache-ab", help="Start --profile with HiCache off, then on, and run the same "
            "workload on both.")] = False,
        profile: Annotated[Optional[str], typer.Option(
            "--profile", "-p", help="Profile for --hicache-ab.")] = None,
        launcher: Annotated[str, typer.Option(
            "--launcher", help="How --hicache-ab starts its servers: docker (up/down), native "
            "(escha-deploy serve --profile as a child), or auto (docker when a daemon answers).")] = "auto",
        seed: SeedOpt = 0,
        prefixes: Annotated[int, typer.Option("--prefixes", help="Concurrent distinct prefixes.", parser=number_option(1, 256, integer=True))] = 8,
        prefix_tokens: Annotated[str, typer.Option("--prefix-tokens", help="Tokens per prefix (K = 1000).")] = "18K",
        prefill_tokens: Annotated[Optional[str], typer.Option("--prefill-tokens", help="Tokens of the cold-prefill prompt (default: --prefix-tokens).")] = None,
        decode_tokens: Annotated[int, typer.Option("--decode-tokens", help="Tokens generated at batch 1.", parser=number_option(2, MAX_TOKENS, integer=True))] = 256,
        answer_tokens: Annotated[int, typer.Option("--answer-tokens", help="Tokens generated per prefix request.", parser=number_option(1, MAX_TOKENS, integer=True))] = 16,
        chart: Annotated[Optional[Path], typer.Option("--chart", help="Also write a PNG chart here (needs matplotlib: pip install '.[chart]' from the escha-deploy checkout).")] = None,
        box: Annotated[Optional[str], typer.Option("--box", help="Name the machine in the table caption, e.g. '2 x RTX 5060 Ti 12 GB, TP 2, WSL2'.")] = None,
        request_timeout: TimeoutOpt = 600.0,
        max_requests: MaxReqOpt = 500,
        api_key: ApiKeyOpt = None,
        api_key_file: ApiKeyFileOpt = None,
        format: FormatOpt = OutputFormat.table,
    ) -> None:
        """Benchmark a server: cold prefill, decode at batch 1, N concurrent long prefixes.

        The prefix passes report first- and second-pass wall time and the second pass's
        cached-token share with the source of that figure. Exit 0 when measured, 2 bad
        input, 3 endpoint unreachable, 4 a request failed.
        """
        import asyncio

        from escha_deploy.bench.models import BenchReport, WorkloadSpec
        from escha_deploy.utils.errors import BadInput

        problems = []
        for url, name in ((endpoint, "--endpoint"), (compare, "--compare")):
            if url is not None:
                try:
                    check_endpoint(url, name)
                except BadInput as exc:
                    problems.extend(exc.problems)
        if hicache_ab and (endpoint or compare):
            problems.append("--hicache-ab starts its own servers: drop --endpoint/--compare")
        if hicache_ab and not profile:
            problems.append("--hicache-ab needs --profile NAME")
        if not hicache_ab and not endpoint:
            problems.append("--endpoint: required (or use --hicache-ab --profile NAME)")
        if profile and not hicache_ab:
            problems.append("--profile is only used with --hicache-ab")
        if launcher not in ("auto", "docker", "native"):
            problems.append(f"--launcher: docker, native or auto (got {launcher!r})")
        elif launcher != "auto" and not hicache_ab:
            problems.append("--launcher is only used with --hicache-ab")
        if chart is not None and chart.suffix.lower() != ".png":
            problems.append(f"--chart: expected a .png path, got {str(chart)!r}")
        elif chart is not None:
            from escha_deploy.utils.paths import check_output

            try:  # a chart that cannot be written is refused before the run, not after it
                check_output(chart, "--chart")
            except BadInput as exc:
                problems.extend(exc.problems)
        if problems:
            raise BadInput(*problems)
        if chart is not None:
            try:
                import matplotlib  # noqa: F401 - fail before a long run, not after
            except ImportError:
                from escha_deploy.bench.render import CHART_INSTALL_HINT, CHART_MISSING

                raise BadInput(CHART_MISSING, hint=CHART_INSTALL_HINT) from None
        from pydantic import ValidationError

        ptok = _tokens(prefix_tokens, "--prefix-tokens")
        try:
            spec = WorkloadSpec(
                seed=seed, prefixes=prefixes, prefix_tokens=ptok,
                prefill_tokens=_tokens(prefill_tokens, "--prefill-tokens") if prefill_tokens else ptok,
                decode_tokens=decode_tokens, answer_tokens=answer_tokens,
            )
        except ValidationError as exc:
            raise BadInput(*(
                f"--{str(e['loc'][0]).replace('_', '-')}: {e['msg'].lower()} (got {e['input']!r})"
                for e in exc.errors()
            )) from None
        kw = dict(request_timeout_s=request_timeout, max_requests=max_requests,
                  api_key=_api_key(ctx, api_key, api_key_file))
        steps = _Steps("bench")
        try:
            if hicache_ab:
                from escha_deploy.bench.ab import load_launcher, run_ab

                report = asyncio.run(run_ab(load_launcher(launcher), profile, spec, steps, **kw))
            else:
                from escha_deploy.bench.workload import bench_endpoint

                runs = [asyncio.run(bench_endpoint(endpoint, spec, steps, **kw))]
                if compare:
                    runs.append(asyncio.run(bench_endpoint(compare, spec, steps, **kw)))
                    # the seed's order, off then on, whichever URL came first
                    runs.sort(key=lambda r: {"off": 0, "on": 1}.get(r.facts.label, 2))
                report = BenchReport(workload=spec, runs=runs,
                                     mode="compare" if compare else "single")
        finally:
            steps.close()
        if box:
            report = report.model_copy(update={"box": box})
        from escha_deploy.bench.last import from_report, save_last_prefill

        last = from_report(report)
        if last is not None:  # plan's host_hit_cost reads the last cold prefill back
            save_last_prefill(last)
        _emit(report, format, chart)

    @app.command("canary", rich_help_panel=PANEL_MEASURE, epilog=CANARY_EXAMPLES)
    def canary(
        ctx: typer.Context,
        endpoint: Annotated[str, typer.Option("--endpoint", "-e", help="Base URL of an SGLang server with HiCache on.")],
        seed: SeedOpt = 0,
        prompt_tokens: Annotated[Optional[str], typer.Option("--prompt-tokens", help="Tokens of the canary prefix (K = 1000; default: 4096, or half the device pool when that is smaller, from /server_info).")] = None,
        answer_tokens: Annotated[int, typer.Option("--answer-tokens", help="Tokens of each answer compared.", parser=number_option(1, MAX_TOKENS, integer=True))] = 32,
        fill_tokens: Annotated[Optional[str], typer.Option("--fill-tokens", help="Tokens of other prompts that push the canary out of the device pool (default: the device pool + 10 %, from /server_info; repeated until sglang:evicted_tokens_total shows the canary left).")] = None,
        max_fill_requests: Annotated[int, typer.Option("--max-fill-requests", help="Refuse a fill that needs more prompts than this.", parser=number_option(1, integer=True))] = 64,
        hybrid: Annotated[Optional[bool], typer.Option("--hybrid/--not-hybrid", help="Whether the model is hybrid (mamba/GDN); default: from the server's model type.", show_default=False)] = None,
        request_timeout: TimeoutOpt = 600.0,
        max_requests: MaxReqOpt = 500,
        api_key: ApiKeyOpt = None,
        api_key_file: ApiKeyFileOpt = None,
        format: FormatOpt = OutputFormat.table,
    ) -> None:
        """Check that a prefix restored from HiCache's host tier answers as it did first.

        Asks at temperature 0, pushes the prefix out of the device pool with other prompts
        (no flush), asks again and compares. Exit 0 pass, 3 mismatch (sglang#39830),
        5 inconclusive (no host-tier hit shown).
        """
        import asyncio

        from escha_deploy.bench.canary import CanaryOptions, canary_endpoint, raise_for
        from escha_deploy.bench.render import canary_lines

        from .output import print_json

        from escha_deploy.utils.errors import BadInput

        check_endpoint(endpoint)
        api_key = _api_key(ctx, api_key, api_key_file)
        ctok = _tokens(prompt_tokens, "--prompt-tokens") if prompt_tokens is not None else None
        if ctok is not None and ctok < 64:
            raise BadInput(f"--prompt-tokens: at least 64 tokens, so the question has a body to "
                           f"ask about (got {prompt_tokens!r})")
        opts = CanaryOptions(
            seed=seed, prompt_tokens=ctok,
            answer_tokens=answer_tokens,
            fill_tokens=_tokens(fill_tokens, "--fill-tokens") if fill_tokens else None,
            max_fill_requests=max_fill_requests, hybrid=hybrid,
        )
        steps = _Steps("canary")
        try:
            result = asyncio.run(canary_endpoint(
                endpoint, opts, steps, request_timeout_s=request_timeout,
                max_requests=max_requests, api_key=api_key))
        finally:
            steps.close()
        if format is OutputFormat.json:
            print_json(result)
        else:
            for line in canary_lines(result):
                typer.echo(line)
        raise_for(result)


def _emit(report, format: OutputFormat, chart: Path | None) -> None:
    from escha_deploy.bench import render

    from .output import info, print_json, stdout_console, warn

    for run in report.runs:
        for w in run.warnings:
            warn(f"{run.facts.url}: {w}")
    if format is OutputFormat.json:
        print_json(report)
    else:
        stdout_console().print(render.table(report))
    if chart is not None:
        render.chart(report, chart)
        info(f"chart written to {chart}")
