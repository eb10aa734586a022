"""``escha-deploy ask PROMPT``: send one chat request to a running server and print the answer,
then where its cached prompt tokens came from (device pool, host tier). Exit 3 when nothing
answers (or the key is refused), 4 when the server fails the request, 2 for bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import FormatOpt, OptionalProfileOpt, OutputFormat, SetOpt, number_option

EXAMPLES = """
Examples:

  escha-deploy ask -p rtx5060ti-tp2-fp8 "Say hello in five words."

  escha-deploy ask -e http://127.0.0.1:30000 --api-key-file ~/.config/escha/key "Why is the sky blue?"
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    @app.command("ask", rich_help_panel=PANEL_LIFECYCLE, epilog=EXAMPLES)
    def ask(
        prompt: Annotated[str, typer.Argument(help="What to ask the model.")],
        profile: OptionalProfileOpt = None,
        set_: SetOpt = None,
        endpoint: Annotated[Optional[str], typer.Option(
            "--endpoint", "-e", help="The server's URL (default: the profile's running server, native or "
            "container, as `status` finds it).")] = None,
        api_key_file: Annotated[Optional[Path], typer.Option(
            "--api-key-file", help="File holding the API key (default: the profile's container.api_key_file, "
            "or the key the running server was started with).")] = None,
        max_tokens: Annotated[int, typer.Option("--max-tokens", parser=number_option(1, 1 << 20, integer=True),
                                                help="Tokens to generate at most.")] = 256,
        timeout: Annotated[float, typer.Option(
            "--timeout", parser=number_option(0.1, 24 * 3600),
            help="Seconds for each request, all of it: connecting, the status line and the whole answer "
            "(a first request after start may compile kernels).")] = 300.0,
        format: FormatOpt = OutputFormat.table,
    ) -> None:
        """Send one request to the running server and print its answer and cached-token sources."""
        from escha_deploy.utils.errors import Refused
        from escha_deploy.launch.first_request import ask as send, check_prompt
        from escha_deploy.launch.prepare import read_secret

        from .output import info, print_json

        check_prompt(prompt)
        if endpoint is not None:  # a URL as bench and canary take it: HOST:PORT alone is bad input, not "down"
            from .bench import check_endpoint

            check_endpoint(endpoint)
        key = read_secret(str(api_key_file), "--api-key-file") if api_key_file else None
        model = None
        if profile is not None:
            from escha_deploy.launch.first_request import served_model_name
            from escha_deploy.profile import load_profile

            prof = load_profile(profile, list(set_ or []))
            model = served_model_name(prof.model.path, prof.model.served_model_name)
            if key is None and prof.container.api_key_file:
                key = read_secret(prof.container.api_key_file, "container.api_key_file")
        if endpoint is None:
            from escha_deploy.profile import profile_name
            from escha_deploy.watch.session import find_targets

            name = profile_name(profile, list(set_ or [])) if profile else None
            targets = [t for t in find_targets(name, note=info) if t.url]
            if not targets:
                raise Refused(f"ask: nothing running{' for profile ' + name if name else ''}",
                              hint="start it with `escha-deploy up`, or name the server with --endpoint")
            endpoint = targets[0].url
            key = key or targets[0].api_key
        assert endpoint is not None
        info(f"ask: {endpoint}")
        answer = send(endpoint.rstrip("/"), prompt, model=model, api_key=key, max_tokens=max_tokens,
                      timeout_s=timeout)
        if format is OutputFormat.json:
            print_json(answer.__dict__)
            return
        from escha_deploy.utils.termtext import printable

        # the server's text, line by line, without what a terminal would act on (escape sequences)
        typer.echo("\n".join(printable(line) for line in answer.text.split("\n")))
        info(answer.cache_line())
