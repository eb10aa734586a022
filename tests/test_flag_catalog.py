"""The committed sglang 0.5.19 flag catalog, its generator, and flagcheck against the real parser.

The tests marked ``wheel`` run the real parser: they need the throwaway virtual environment
that ``.ci/check-flag-catalog.sh`` builds (``.cache/flagcat-venv``, or ``ESCHA_FLAGCAT_VENV``)
and skip without it; CI builds it before pytest runs, so there they run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from escha_deploy.sglang import flagcheck, releases
from escha_deploy.utils import paths

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gen_flag_catalog.py"
CI_SCRIPT = REPO / ".ci" / "check-flag-catalog.sh"
CATALOG = paths.catalog_dir() / "releases" / "0.5.19" / "flags.json"
#: Actions of each release's real parser (counted when each catalog was generated).
ACTION_COUNTS = {"0.5.19": 504, "0.5.23": 532}
RELEASES = releases.supported_releases()

#: Action classes the 0.5.19 parser uses, with the nargs each may have (argparse and
#: sglang/srt/arg_groups/argparse_actions.py). flagcheck reads values by nargs only, so an
#: unfamiliar class in a regenerated catalog must be looked at before it is trusted.
KNOWN_ACTIONS = {
    "_StoreAction": {None, "?", "*", "+"},
    "_StoreTrueAction": {0},
    "_HelpAction": {0},
    "BooleanOptionalAction": {0},
    "LoRAPathAction": {"*"},
    "DeprecatedAction": {0},
    "DeprecatedStoreTrueAction": {0},
    "DeprecatedStoreConstAction": {0, None},  # None: 0.5.23 retires a valued flag (--monokernel-backend amd)
    "DeprecatedAliasStoreAction": {None, "+"},
}


def _generator():
    """The generator module (standard library only at import; it imports sglang on demand)."""
    spec = importlib.util.spec_from_file_location("gen_flag_catalog", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _raw(release: str = "0.5.19") -> dict:
    return json.loads(flagcheck.catalog_path(release).read_text(encoding="utf-8"))


@pytest.mark.parametrize("release", RELEASES)
def test_catalog_header(release: str) -> None:
    raw = _raw(release)
    assert raw["schema"] == flagcheck.CATALOG_SCHEMA == 1
    assert (raw["runtime"], raw["version"]) == ("sglang", release)
    assert raw["positional"] == [] and raw["mutually_exclusive"] == []
    assert raw["allow_abbrev"] is True
    assert flagcheck.catalog_path() == CATALOG


@pytest.mark.parametrize("release", RELEASES)
def test_catalog_is_in_canonical_form(release: str) -> None:
    """The file is exactly what the generator writes (no hand edits, one action per line)."""
    text = flagcheck.catalog_path(release).read_text(encoding="utf-8")
    assert _generator().render(json.loads(text)) == text


@pytest.mark.parametrize("release", RELEASES)
def test_catalog_actions_are_well_formed(release: str) -> None:
    actions = _raw(release)["actions"]
    # a release without a pinned count (one being added: its test data is not code) has at least
    # the fewest actions of a pinned one, so a truncated catalog fails; its content is checked
    # against the real parser by .ci/check-flag-catalog.sh
    if release in ACTION_COUNTS:
        assert len(actions) == ACTION_COUNTS[release]
    else:
        assert len(actions) >= min(ACTION_COUNTS.values()), len(actions)
    options = [o for a in actions for o in a["flags"]]
    assert len(options) == len(set(options)), "an option string appears twice"
    for a in actions:
        assert a["dest"].isidentifier(), a
        assert a["action"] in KNOWN_ACTIONS, a
        assert a.get("nargs") in KNOWN_ACTIONS[a["action"]], a
        assert (a.get("type") or "str") in flagcheck.TYPES, a
        assert all(o.startswith("-") for o in a["flags"]), a
        if "choices" in a:
            assert isinstance(a["choices"], list) and a["choices"], a
    assert [a["flags"] for a in actions if a.get("required")] == [["--model-path", "--model"]]


@pytest.mark.parametrize(
    ("flag", "dest", "type_name", "choices"),
    [
        ("--hicache-size", "hicache_size", "int", None),
        ("--hicache-ratio", "hicache_ratio", "float", None),
        ("--hicache-mem-layout", "hicache_mem_layout", "str",
         ["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"]),
        ("--max-total-tokens", "max_total_tokens", "sglang.srt.utils.common.human_readable_int", None),
        ("--tensor-parallel-size", "tp_size", "int", None),
        ("--mamba-ssm-dtype", "mamba_ssm_dtype", "str", ["float32", "bfloat16", "float16"]),
    ],
)
def test_flags_the_planner_renders(flag: str, dest: str, type_name: str, choices: list | None) -> None:
    spec = flagcheck.load_catalog().by_option[flag]
    assert (spec.dest, spec.type) == (dest, type_name)
    assert spec.choices == (None if choices is None else tuple(choices))


def test_ci_script_is_wired() -> None:
    assert CI_SCRIPT.is_file() and os.access(CI_SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(CI_SCRIPT)], check=True)
    assert "check-flag-catalog.sh" in (REPO / ".ci" / "test").read_text(encoding="utf-8")


@pytest.mark.parametrize("release", releases.supported_releases())
def test_requirements_pin_cpu_torch_and_every_package(release: str) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--print-requirements", "--release", release], check=True,
        capture_output=True, text=True,
    ).stdout.split()
    assert "torch==2.13.0" in out
    assert all("==" in line for line in out), out


def test_generator_refuses_a_release_without_a_folder() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--print-requirements", "--release", "0.0.1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "sglang 0.0.1 has no release folder" in proc.stderr


# --------------------------------------------------------------------------------------------
# Against the real parser (the wheel installed in the throwaway venv)
# --------------------------------------------------------------------------------------------


def _venv_python(release: str) -> Path:
    """The flag-catalog venv of ``release`` (``.ci/check-flag-catalog.sh VERSION`` builds it):
    ``.cache/flagcat-venv`` for the default release, ``.cache/flagcat-venv-VERSION`` else."""
    if release == releases.default_release():
        venv = Path(os.environ.get("ESCHA_FLAGCAT_VENV") or REPO / ".cache" / "flagcat-venv")
    else:
        venv = REPO / ".cache" / f"flagcat-venv-{release}"
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no flag-catalog venv at {venv}; .ci/check-flag-catalog.sh {release} builds it")
    return python


#: One interpreter in the flag-catalog venv runs the generator's ``main`` twice: regenerate the
#: catalog, then parse the argv list with the real parser. Importing sglang's server_args is
#: most of each run (about 20 s here); the second call reuses the import.
_BOTH = """
import runpy, sys
g = runpy.run_path(sys.argv[1])
rc = g["main"](["--out", sys.argv[2]])
if rc:
    sys.exit(rc)
sys.exit(g["main"](["--parse-json", sys.argv[3]]))
"""


@pytest.fixture(scope="module", params=RELEASES)
def real_parser(request, tmp_path_factory):
    """``(release, catalog path, parser verdicts)`` from one run of the generator in the
    release's flag-catalog venv, over ``DIFFERENTIAL + STRICTER``."""
    release = request.param
    tmp = tmp_path_factory.mktemp("flagcat")
    out, argvs = tmp / "catalog.json", tmp / "argv.json"
    argvs.write_text(json.dumps(DIFFERENTIAL + STRICTER), encoding="utf-8")
    proc = subprocess.run([str(_venv_python(release)), "-c", _BOTH, str(SCRIPT), str(out), str(argvs)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return release, out, json.loads(proc.stdout)


@pytest.mark.wheel
def test_regenerated_catalog_matches_the_committed_one(real_parser) -> None:
    release, out, _ = real_parser
    assert out.read_text(encoding="utf-8") == flagcheck.catalog_path(release).read_text(encoding="utf-8")


M = ["--model-path", "x"]

#: Argv the real parser and flagcheck must judge alike (accept both, or reject both).
DIFFERENTIAL: list[list[str]] = [
    M + ["--tp-size", "2", "--enable-hierarchical-cache", "--hicache-ratio", "1.45",
         "--hicache-mem-layout", "page_first", "--hicache-io-backend", "kernel",
         "--kv-cache-dtype", "fp8_e4m3", "--page-size", "8", "--max-total-tokens", "210000",
         "--max-mamba-cache-size", "16", "--mem-fraction-static", "0.7",
         "--mamba-ssm-dtype", "float32"],
    ["--tp-size", "2"],
    ["--model", "x"],
    M + ["--bogus"],
    M + ["-x"],
    M + ["--hicache-mem-layout", "sideways"],
    M + ["--hicache-size", "1.5"],
    M + ["--hicache-size", "8"],
    M + ["--kv-cache-dtype", "int2"],
    M + ["--kv-cache-quant-group-size", "64"],
    M + ["--page-size"],
    M + ["--page-size", "--tp-size", "2"],
    M + ["--page-size=8"],
    M + ["--page-size", " 8 "],
    M + ["--page-size", "8.0"],
    M + ["--page-size", "1_0"],
    M + ["--page-size", "+8"],
    M + ["--enable-hierarchical-cache=1"],
    M + ["--tp-size", "2", "4"],
    M + ["--chunked-prefill-size", "-1"],
    M + ["--chunked-prefill-size", "-1e3"],
    M + ["--hicache-ratio", "-.5"],
    M + ["--hicache-ratio", "nan"],
    M + ["--hicache-ratio", "1e-3"],
    M + ["--hicache-ratio", "two"],
    M + ["--served-model-name", "-a b"],
    M + ["--served-model-name", "-ab"],
    M + ["--log-requests-level", "2"],
    M + ["--log-requests-level", "4"],
    M + ["--log-requests-level", "two"],
    M + ["--cuda-graph-bs-decode", "1", "2", "4"],
    M + ["--cuda-graph-bs-decode", "1", "x"],
    M + ["--cuda-graph-bs-decode"],
    M + ["--uvicorn-access-log-exclude-prefixes"],
    M + ["--model-checksum"],
    M + ["--model-checksum", "abc"],
    M + ["--no-dllm-fdfo"],
    M + ["--dllm-fdfo=1"],
    M + ["--nsa-prefill-backend", "flashmla_kv"],
    M + ["--nsa-prefill-backend", "nope"],
    M + ["--enable-expert-distribution-metrics"],
    M + ["--disable-cuda-graph", "--stream-output"],
    M + ["--help"],
    M + ["--sampling-backend", "pytorch"],
    M + ["--sampling-backend", "token_oracle"],
    M + ["--reasoning-parser", "qwen3"],
    M + ["--tool-call-parser", "nope"],
]
for _v in ["1k", "1M", "25.6k", "1Ki", "1.5Ki", "1.5k", "0.5k", "abc", "-5", " 7 ", "1e3",
           "1K", "0x10", "1_000", "16Gi", "1.25T"]:
    DIFFERENTIAL.append(M + ["--max-total-tokens", _v])
for _flag, _v in [
    ("--sidecar-args", "[1, 2]"), ("--sidecar-args", "[NaN]"), ("--sidecar-args", "[1e400]"),
    ("--sidecar-args", "[1,]"), ("--sidecar-args", "not json"),
    ("--preferred-sampling-params", '{"temperature": 0.6}'),
    ("--preferred-sampling-params", "[NaN]"), ("--preferred-sampling-params", "{bad"),
    ("--cuda-graph-config", '{"decode": {"max_bs": 16}}'),
    ("--cuda-graph-config", '{"verify": {}}'), ("--cuda-graph-config", '{"decode": {"x": 1}}'),
    ("--cuda-graph-config", "[]"), ("--cuda-graph-config", '{"decode": 3}'),
    ("--cuda-graph-config", '{"decode": {"tc_compiler": "x"}}'),
    ("--cuda-graph-config", '{"prefill": {"max_seq_len": 4096}}'),
    ("--cuda-graph-backend-decode", "full"), ("--cuda-graph-backend-decode", "tc_piecewise"),
    ("--cuda-graph-max-bs", "8"), ("--dp-size", "2"),
]:
    DIFFERENTIAL.append(M + [_flag, _v])
DIFFERENTIAL.append(M + ["--enable-dp-attention", "--dp-size", "2"])

#: Argv the real parser accepts and flagcheck rejects on purpose (see its module docstring).
STRICTER: list[list[str]] = [
    M + ["--hicache-rat", "2"],
    M + ["--page-size", "8", "--"],
]


@pytest.mark.wheel
def test_flagcheck_agrees_with_the_real_parser(real_parser) -> None:
    cases = DIFFERENTIAL + STRICTER
    release, _, real = real_parser
    disagree = []
    for argv, verdict in zip(cases, real, strict=True):
        ours = flagcheck.check_argv(argv, set(), version=release)
        expected_ours = verdict["ok"] and argv not in STRICTER
        if ours.ok != expected_ours:
            disagree.append((argv, verdict["error"], ours.error_lines()))
        if ours.ok:
            # Every value the parser stored came from a flag flagcheck read, with the same dest.
            missing = set(verdict["dests"]) - {u.dest for u in ours.flags}
            if missing:
                disagree.append((argv, f"parser set {sorted(missing)}", "flagcheck did not"))
    assert not disagree, "\n".join(map(repr, disagree))
    assert sum(v["ok"] for v in real) >= 30 and sum(not v["ok"] for v in real) >= 25
