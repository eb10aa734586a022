"""escha_deploy.sglang.flagcheck: argv checked against the committed sglang 0.5.19 catalog.

The catalog itself is compared with the real parser in tests/test_flag_catalog.py (wheel) and
by .ci/check-flag-catalog.sh; these tests pin how argv is read and what is reported.
"""

from __future__ import annotations

import json

import pytest

from escha_deploy.sglang import capabilities as caps
from escha_deploy.sglang import flagcheck
from escha_deploy.utils.errors import BadInput, ExitCode
from escha_deploy.sglang.flagcheck import check_argv

REALISTIC = [
    "--model-path", "/models/x", "--tp-size", "2", "--enable-hierarchical-cache",
    "--hicache-ratio", "1.45", "--hicache-mem-layout", "page_first",
    "--hicache-io-backend", "kernel", "--kv-cache-dtype", "fp8_e4m3", "--page-size", "8",
    "--max-total-tokens", "210000", "--max-mamba-cache-size", "16",
    "--mem-fraction-static", "0.7", "--mamba-ssm-dtype", "float32",
]
MODEL = ["--model-path", "/models/x"]
INT2 = ["--kv-cache-dtype", "int2", "--kv-cache-quant-group-size", "64"]


def _errors_for(argv: list[str], capabilities: set[str] = frozenset()) -> list[str]:
    return check_argv(argv, capabilities).error_lines()


def test_realistic_argv_is_accepted_and_verified() -> None:
    result = check_argv(["python", "-m", "sglang.launch_server", *REALISTIC], set())
    assert result.ok, result.error_lines()
    assert result.warnings == ()
    assert [u.canonical for u in result.flags] == [t for t in REALISTIC if t.startswith("--")]
    assert {u.status for u in result.flags} == {"verified"}
    by_dest = {u.dest: u for u in result.flags}
    assert by_dest["hicache_ratio"].values == ("1.45",)
    assert by_dest["enable_hierarchical_cache"].values == ()


@pytest.mark.parametrize(
    "head",
    [
        ["python", "-m", "sglang.launch_server"],
        ["/usr/bin/python3.11", "-X", "dev", "-m", "sglang.launch_server"],
        ["sglang", "serve"],
        ["/opt/venv/bin/sglang", "serve"],
        [],
    ],
    ids=["python-m", "python-options", "sglang-serve", "sglang-serve-path", "bare"],
)
def test_command_heads_are_stripped(head: list[str]) -> None:
    assert check_argv([*head, *REALISTIC], set()).ok


def test_unknown_command_is_named() -> None:
    lines = _errors_for(["python", "-m", "vllm.entrypoints.openai.api_server", *REALISTIC])
    assert len(lines) == 1 and lines[0].startswith("python: not an SGLang server command")


def test_unknown_flag_is_rejected_by_name() -> None:
    lines = _errors_for([*REALISTIC, "--warp-drive", "9"])
    assert lines == ["--warp-drive: unknown to sglang 0.5.19"]


def test_misspelt_flag_gets_a_suggestion() -> None:
    lines = _errors_for([*MODEL, "--page-sise", "8"])
    assert lines == ["--page-sise: unknown to sglang 0.5.19; did you mean --page-size?"]


def test_bad_choice_is_rejected_with_the_choices() -> None:
    lines = _errors_for([*MODEL, "--hicache-mem-layout", "sideways"])
    assert len(lines) == 1
    assert lines[0].startswith("--hicache-mem-layout: invalid choice 'sideways' (choose from ")
    assert "page_first_direct" in lines[0]


def test_non_int_hicache_size_is_rejected() -> None:
    assert _errors_for([*MODEL, "--hicache-size", "1.5"]) == [
        "--hicache-size: invalid int value '1.5'"
    ]


def test_int2_needs_the_int2_kv_capability() -> None:
    lines = _errors_for([*MODEL, *INT2])
    assert len(lines) == 2
    assert lines[0].startswith("--kv-cache-dtype: invalid choice 'int2'")
    assert lines[1].startswith("--kv-cache-quant-group-size: unknown to sglang 0.5.19")
    assert all("declared by the capability int2-kv" in line for line in lines)


def test_int2_with_the_capability_is_declared_not_verified() -> None:
    result = check_argv([*MODEL, *INT2], {"int2-kv"})
    assert result.ok, result.error_lines()
    status = {u.canonical: (u.status, u.capability) for u in result.flags}
    assert status == {
        "--model-path": ("verified", None),
        "--kv-cache-dtype": ("declared", "int2-kv"),
        "--kv-cache-quant-group-size": ("declared", "int2-kv"),
    }
    assert [u.canonical for u in result.declared()] == [
        "--kv-cache-dtype", "--kv-cache-quant-group-size",
    ]


def test_stock_choice_stays_verified_under_a_capability() -> None:
    result = check_argv([*MODEL, "--kv-cache-dtype", "fp8_e4m3"], {"int2-kv"})
    assert result.ok
    assert result.flags[1].status == "verified"


def test_declared_int_flag_checks_its_type() -> None:
    lines = _errors_for([*MODEL, "--kv-cache-quant-group-size", "sixty-four"], {"int2-kv"})
    assert lines == ["--kv-cache-quant-group-size: invalid int value 'sixty-four'"]


def test_w2_weights_declares_a_quantization_choice() -> None:
    argv = [*MODEL, "--quantization", "escha_w2"]
    assert not check_argv(argv, set()).ok
    result = check_argv(argv, {"w2-weights"})
    assert result.ok and result.flags[1].status == "declared"
    assert result.flags[1].capability == "w2-weights"


@pytest.mark.parametrize("name", sorted(caps.CAPABILITIES))
def test_every_capability_agrees_with_the_catalog(name: str) -> None:
    """A declaration that names an existing flag must use its dest; a new flag a new dest."""
    catalog = flagcheck.load_catalog()
    for decl in caps.declared_flags({name}):
        spec = catalog.by_option.get(decl.flag)
        if spec is not None:
            assert spec.dest == decl.dest
            assert decl.choices, f"{decl.flag} exists in sglang; {name} must say what it adds"
            assert not set(decl.choices) & set(spec.choices or ()), "choice already stock"
        else:
            assert decl.dest not in {s.dest for s in catalog.actions}
    check_argv(MODEL, {name})  # builds the merged parser; raises on disagreement


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([*MODEL, "--page-size"], "--page-size: expected one value"),
        ([*MODEL, "--page-size", "--tp-size", "2"], "--page-size: expected one value"),
        ([*MODEL, "--enable-hierarchical-cache=yes"],
         "--enable-hierarchical-cache: takes no value (got =yes)"),
        ([*MODEL, "--cuda-graph-bs-decode"], "--cuda-graph-bs-decode: expected at least one value"),
        ([*MODEL, "--tp-size", "2", "4"], "4: unexpected value: no flag takes it "
                                           "(the server parser has no positional arguments)"),
        ([*MODEL, "--max-total-tokens", "1.5Ki"], "--max-total-tokens: invalid "
         "human_readable_int value '1.5Ki' (decimals are not allowed with IEC suffix Ki)"),
        ([*MODEL, "--max-total-tokens", "210kb"],
         "--max-total-tokens: invalid human_readable_int value '210kb' (invalid literal for "
         "int() with base 10: '210kb')"),
        ([*MODEL, "--hicache-ratio", "two"], "--hicache-ratio: invalid float value 'two'"),
        ([*MODEL, "--hicache-rat", "2"],
         "--hicache-rat: abbreviation of --hicache-ratio; write the flag in full"),
        ([*MODEL, "--help"], "--help: prints help and exits; not a server flag"),
        ([*MODEL, "--"], "--: not expected in a server argv"),
        ([*MODEL, "--enable-expert-distribution-metrics"],
         "--enable-expert-distribution-metrics: --enable-expert-distribution-metrics is no "
         "longer supported. Use --expert-balancedness-report-mode with one of: off, "
         "server_log, prometheus, both."),
        (["--tp-size", "2"], "--model-path/--model: required"),
    ],
    ids=["missing-last", "missing-before-flag", "store-true-value", "plus-empty", "stray",
         "iec-decimal", "bad-suffix", "float", "abbrev", "help", "dashdash", "removed",
         "required"],
)
def test_rejections_name_the_flag(argv: list[str], expected: str) -> None:
    assert _errors_for(argv) == [expected]


@pytest.mark.parametrize(
    "extra",
    [
        ["--chunked-prefill-size", "-1"],
        ["--hicache-ratio=1.45"],
        ["--max-total-tokens", "210k"],
        ["--context-length", "25.6k"],
        ["--max-prefill-tokens", "16Ki"],
        ["--cuda-graph-bs-decode", "1", "2", "4", "--page-size", "8"],
        ["--uvicorn-access-log-exclude-prefixes"],
        ["--model-checksum"],
        ["--no-lora-strict-loading"],
        ["--json-model-override-args", '{"num_hidden_layers": 2}'],
        ["--preferred-sampling-params", '{"temperature": 0.6}'],
        ["--cuda-graph-config", '{"decode": {"max_bs": 16}}'],
        ["--model", "/models/y"],
    ],
    ids=lambda extra: extra[0],
)
def test_accepts_what_the_parser_accepts(extra: list[str]) -> None:
    result = check_argv([*MODEL, *extra], set())
    assert result.ok, result.error_lines()


def test_json_values_are_parsed() -> None:
    lines = _errors_for([*MODEL, "--preferred-sampling-params", "{temperature: 0.6}"])
    assert len(lines) == 1 and lines[0].startswith("--preferred-sampling-params: invalid JSON value")
    lines = _errors_for([*MODEL, "--cuda-graph-config", '{"verify": {}}'])
    assert len(lines) == 1 and "unknown phase 'verify'" in lines[0]


def test_warnings_for_duplicates_deprecated_and_config() -> None:
    result = check_argv(
        [*MODEL, "--page-size", "8", "--page-size", "16", "--disable-cuda-graph",
         "--config", "/etc/x.yaml"],
        set(),
    )
    assert result.ok
    assert [w.line() for w in result.warnings] == [
        "--page-size: sets page_size more than once; the last one wins",
        "--disable-cuda-graph: deprecated in sglang 0.5.19; "
        "use --cuda-graph-backend-{decode,prefill}=disabled",
        "--config: the options in the YAML file are not checked",
    ]


def test_fragment_without_model_path() -> None:
    assert check_argv(["--page-size", "8"], set(), require_model=False).ok


def test_raise_for_errors_is_bad_input_one_line_each() -> None:
    result = check_argv([*MODEL, "--hicache-size", "1.5", "--bogus"], set())
    with pytest.raises(BadInput) as info:
        result.raise_for_errors("profiles/x.yaml")
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert info.value.problems == (
        "profiles/x.yaml: --hicache-size: invalid int value '1.5'",
        "profiles/x.yaml: --bogus: unknown to sglang 0.5.19",
    )
    check_argv(MODEL, set()).raise_for_errors()  # no errors, no raise


def test_result_serializes_to_json() -> None:
    data = json.loads(check_argv([*MODEL, *INT2], {"int2-kv"}).model_dump_json())
    assert data["flags"][1] == {
        "flag": "--kv-cache-dtype", "canonical": "--kv-cache-dtype", "dest": "kv_cache_dtype",
        "values": ["int2"], "status": "declared", "capability": "int2-kv",
    }
    assert data["capabilities"] == ["int2-kv"] and data["errors"] == []


def test_catalog_is_loaded_once() -> None:
    assert flagcheck.load_catalog() is flagcheck.load_catalog()
    assert len(flagcheck.load_catalog().actions) == 504
