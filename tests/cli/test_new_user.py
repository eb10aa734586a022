"""What a new user meets first, as the CLI prints it: `diagnose` on a log alone, the help
texts' examples and install hints."""

from __future__ import annotations

import re

ILLEGAL = ["[2026-11-29 16:20:01 TP1] Scheduler hit an exception: Traceback (most recent call last):",
           "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"]
# SGLang 0.5.19's startup line: sglang/srt/entrypoints/engine.py:265 logs server_args.resolved_dict().
ARGS_ON = "[2026-11-29 16:19:01] server_args={'model_path': '/models/q', 'enable_hierarchical_cache': True}"


def test_diagnose_log_alone_does_not_assume_hicache_off(cli, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("\n".join(ILLEGAL) + "\n")
    r = cli("diagnose", str(log))
    assert r.code == 5, r.out + r.err
    assert "(HiCache is off, so not the host pool)" not in r.out.split("if hicache_enabled=False")[0]
    assert "--hicache or --no-hicache" in r.out and "exit status None" not in r.out
    assert cli("diagnose", str(log), "--no-hicache").code == 0


def test_diagnose_reads_hicache_from_the_server_args_line(cli, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("\n".join([ARGS_ON, *ILLEGAL]) + "\n")
    r = cli("diagnose", str(log), "--no-wsl2")
    assert r.code == 0, r.out + r.err
    assert "retry without HiCache" in r.out and "HiCache is off" not in r.out
    assert cli("diagnose", str(log)).code == 5  # WSL2 or not decides the cause: unknown here


def test_diagnose_first_line_says_what_was_read(cli, tmp_path, monkeypatch):
    """It began "diagnosis: log read", which said nothing a user could check."""
    import io
    import sys

    log = tmp_path / "server.log"
    log.write_text("\n".join(ILLEGAL) + "\n")
    r = cli("diagnose", str(log))
    assert r.out.splitlines()[0] == f"diagnose: read 2 lines of {log}", r.out
    assert "log read" not in r.out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(ILLEGAL[1].encode() + b"\n")))
    r = cli("diagnose", "-", "--exit-code", "137")
    assert r.out.splitlines()[:2] == ["diagnose: read 1 line of standard input",
                                      "diagnosis: server exited with code 137 (signal 9, SIGKILL)"], r.out


def test_diagnose_help_keeps_example_lines(cli):
    out = cli("diagnose", "--help").out
    assert "\n    escha-deploy diagnose server.log\n" in out
    assert "\n    docker logs my-sglang 2>&1 | escha-deploy diagnose - --exit-code 137\n" in out


def test_hicache_off_plan_recommends_no_ratio(cli):
    import json

    args = ("plan", "--profile", "rtx5060ti-tp2", "--host-ram", "12GiB")
    data = json.loads(cli(*args, "-f", "json").out)
    assert data["verdict"] == "hicache_off" and data["recommended_ratio"] is None
    assert 0 < data["max_safe_ratio"] < 1.0  # below hicache.min_ratio 1.0: the reason HiCache is off
    text = cli(*args).out
    assert "recommended:" not in text and f"largest safe ratio: {data['max_safe_ratio']}" in text


def test_install_hints_name_the_checkout_extras_as_printed(cli):
    """The extras live in this checkout's pyproject.toml (escha-deploy is not on PyPI)."""
    import re

    help_text = re.sub(r"\s+", " ", cli("bench", "--help").out)
    assert "pip install '.[chart]' from the escha-deploy checkout" in help_text and "\\[" not in help_text
    from escha_deploy.doctor.checks import NO_GPU_FIX

    assert "pip install '.[gpu]'" in NO_GPU_FIX and "escha-deploy[" not in NO_GPU_FIX


def test_plan_up_and_compose_share_the_default_profile(cli):
    from escha_deploy.cli.options import DEFAULT_PROFILE

    # the reference box served without a fork's commits; the INT2 flagship is always named
    assert DEFAULT_PROFILE == "rtx5060ti-tp2-fp8"
    from escha_deploy.profile import load_profile

    assert not {"int2-kv", "w2-weights"} & set(load_profile(DEFAULT_PROFILE).runtime.needs)
    assert cli("compose").out.startswith(f"# Rendered by `escha-deploy compose --profile {DEFAULT_PROFILE}`")
    for verb in ("plan", "up", "compose"):
        # help wraps at 80 columns, here inside the hyphenated name: join such a break first
        out = " ".join(re.sub(r"-\n\s+", "-", cli(verb, "--help").out).split())
        assert f"[default: {DEFAULT_PROFILE}]" in out, verb


import pytest  # noqa: E402


@pytest.mark.parametrize("argv", [["plan", "rtx5060ti-tp2"], ["compose", "rtx5060ti-tp2-fp8"],
                                  ["down", "rtx5060ti-tp2"], ["doctor", "--no-probes", "linux-tp2-l3"]])
def test_a_profile_given_as_an_argument_gets_a_did_you_mean(cli, argv):
    r = cli(*argv)
    assert r.code == 2
    assert r.err.splitlines() == [f"error: Got unexpected extra argument(s) ({argv[-1]})",
                                  f"hint: did you mean `--profile {argv[-1]}`?"]


def test_a_profile_file_as_an_argument_gets_the_hint_and_other_words_do_not(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rt.json").write_text('{"extends": "rtx5060ti-tp2", "name": "rt"}')
    assert cli("plan", "rt.json").err.splitlines()[-1] == "hint: did you mean `--profile rt.json`?"
    other = cli("plan", "nonsense")  # neither a shipped name nor a file: the usual hint
    assert other.code == 2 and other.err.splitlines()[-1] == "hint: see `escha-deploy plan --help`"
    # a command without --profile: no profile hint
    assert cli("profiles", "list", "rtx5060ti-tp2").err.splitlines()[-1] == "hint: see `escha-deploy profiles list --help`"


def test_profiles_validate_reads_a_json_file_by_its_bare_name(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rt.json").write_text('{"extends": "rtx5060ti-tp2", "name": "rt"}')
    r = cli("profiles", "validate", "rt.json")
    assert (r.code, r.out, r.err) == (0, "ok: rt.json\n", "")


def test_bench_help_offers_only_the_key_routes_that_work(cli):
    """`--api-key KEY` is always refused (ps shows it to every user): --help no longer lists it,
    names the two routes that work, and the option still answers with its reason when typed."""
    for verb in ("bench", "canary"):
        out = cli(verb, "--help").out
        assert not re.search(r"--api-key\b(?!-file)", out), out
        assert "--api-key-file" in out and "ESCHA_API_KEY" in out
    r = cli("bench", "-e", "http://127.0.0.1:9", "--api-key", "not-a-real-key")
    assert r.code == 2 and "not-a-real-key" not in r.out + r.err
    assert r.err.splitlines()[0].startswith("error: --api-key: a key on the command line is visible"), r.err
    r = cli("bench", "-e", "http://user:pw@127.0.0.1:9")
    assert r.code == 2 and "--api-key-file or ESCHA_API_KEY" in r.err, r.err
