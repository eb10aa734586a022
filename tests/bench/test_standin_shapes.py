"""The stand-in's response shapes against SGLang 0.5.19's own models, from the real wheel.

``entrypoints/openai/protocol.py`` (the pydantic response models with their custom
serializers) and ``entrypoints/openai/usage_processor.py`` are loaded from the wheel by path,
under a stub ``sglang`` package: importing ``sglang`` itself pulls in torch and friends. Each
stand-in response must parse with the real model *and* come out of the real serializer
unchanged, so a field the stand-in adds, drops or shapes differently fails here.
Needs the wheel (``.ci/test`` downloads it) and ``openai==2.6.1`` (the version SGLang 0.5.19
pins; ``.ci/test`` installs it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
import zipfile
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.wheel

WHEEL = "sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl"
FILES = ("protocol", "usage_processor")


def _wheel() -> Path | None:
    env = os.environ.get("ESCHA_SGLANG_WHEEL")
    repo = Path(__file__).resolve().parents[2]
    for p in ([Path(env)] if env else []) + [repo / ".cache" / "wheels" / WHEEL,
                                             Path("/tmp/wheels") / WHEEL]:
        if p.is_file():
            return p
    return None


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The real ``protocol`` and ``usage_processor`` modules, as ``(protocol, usage)``."""
    wheel = _wheel()
    if wheel is None:
        pytest.skip(f"the real {WHEEL} is not here (.ci/test downloads it)")
    pytest.importorskip("openai", reason="SGLang's protocol.py imports openai (pinned 2.6.1)")
    out = tmp_path_factory.mktemp("sglang-protocol")
    with zipfile.ZipFile(wheel) as z:
        for name in FILES:
            (out / f"{name}.py").write_bytes(
                z.read(f"sglang/srt/entrypoints/openai/{name}.py"))
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    pkgs = ["sglang", "sglang.srt", "sglang.srt.entrypoints", "sglang.srt.entrypoints.openai"]
    for name in pkgs:
        mod = types.ModuleType(name)
        mod.__path__ = []  # a package, so submodules resolve through sys.modules
        sys.modules[name] = mod
    utils = types.ModuleType("sglang.utils")
    utils.convert_json_schema_to_str = lambda schema: json.dumps(schema)  # request-side only
    sys.modules["sglang.utils"] = utils
    loaded = []
    for name in FILES:
        full = f"sglang.srt.entrypoints.openai.{name}"
        spec = importlib.util.spec_from_file_location(full, out / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        spec.loader.exec_module(mod)
        loaded.append(mod)
    yield tuple(loaded)
    for name in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def _complete(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"prompt": "Entry 1: the code is 7.",
                                                     "max_tokens": 4, **body})


@pytest.mark.parametrize("cache_report", [True, False])
def test_completion_response_round_trips_through_the_real_model(real, standin, cache_report):
    protocol, _ = real
    srv = standin(cache_report=cache_report)
    for _ in range(2):  # the second answer has cached tokens (device hit)
        data = _complete(srv.url, return_cached_tokens_details=True,
                         return_token_ids=True).json()
        again = protocol.CompletionResponse.model_validate(data).model_dump(mode="json")
        assert again == data
    assert data["usage"]["prompt_tokens_details"] == (
        {"cached_tokens": data["usage"]["prompt_tokens"] - 1} if cache_report else None)
    assert set(data["sglext"]["cached_tokens_details"]) == {"device", "host"}


def test_stream_chunks_round_trip_through_the_real_models(real, standin):
    protocol, _ = real
    srv = standin()
    _complete(srv.url)
    r = _complete(srv.url, stream=True, stream_options={"include_usage": True},
                  return_cached_tokens_details=True, return_token_ids=True)
    lines = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(ln) for ln in lines[:-1]]
    for c in chunks[:-1]:  # content and sglext chunks: model_dump_json()
        assert json.loads(protocol.CompletionStreamResponse.model_validate(c).model_dump_json()) == c
    last = chunks[-1]  # the usage chunk is dumped with exclude_none=True
    model = protocol.CompletionStreamResponse.model_validate(last)
    assert json.loads(model.model_dump_json(exclude_none=True)) == last
    assert any("sglext" in c for c in chunks) and "usage" in last


@pytest.mark.parametrize("cached, report", [(0, True), (900, True), (900, False)])
def test_usage_matches_the_real_usage_processor(real, cached, report):
    from .standin_sglang import StandinConfig, StandinServer, _Hit

    _, usage = real
    srv = StandinServer(StandinConfig(cache_report=report, metrics=False))
    mine = srv.usage(1000, 16, _Hit(device=cached), stream=False)
    theirs = usage.UsageProcessor.calculate_response_usage(
        [{"meta_info": {"prompt_tokens": 1000, "completion_tokens": 16,
                        "cached_tokens": cached}}],
        enable_cache_report=report,
    ).model_dump(mode="json")
    assert mine == theirs


def test_tokenize_response_parses_with_the_real_model(real, standin):
    protocol, _ = real
    data = httpx.post(standin().url + "/v1/tokenize", json={"prompt": "a b c"}).json()
    assert protocol.TokenizeResponse.model_validate(data).model_dump() == data
