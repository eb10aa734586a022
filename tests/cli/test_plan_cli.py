"""``escha-deploy plan`` and ``profiles`` as users run them: exit codes, JSON, one-line errors."""

import json
import re

import pytest

from escha_deploy.facts.machine import read_meminfo

REQUIRED = {"profile", "tp_size", "hicache", "per_rank", "pinned_total_bytes", "max_safe_ratio",
            "recommended_ratio", "runtime_check", "verdict", "reasons", "decisions"}


def test_plan_json_has_the_contract(cli):
    r = cli("plan", "--profile", "rtx5060ti-tp2", "--ratio", "2", "--host-ram", "16GiB", "--wsl2", "--format", "json")
    assert r.code == 3  # unsafe
    d = json.loads(r.out)
    assert REQUIRED <= d.keys()
    assert d["hicache"] == {**d["hicache"], "enabled": True, "ratio": 2.0, "size_gb": None}
    assert {k: d["per_rank"][k] for k in ("host_kv_bytes", "host_mamba_bytes")} == {
        "host_kv_bytes": 2_580_529_152, "host_mamba_bytes": 2_540_077_056}
    for k in ("device_kv_bytes", "device_mamba_bytes", "pinned_bytes"):
        assert isinstance(d["per_rank"][k], int)
    assert d["pinned_total_bytes"] == 10_241_212_416
    assert d["runtime_check"]["stock"] == "refuse" and d["runtime_check"]["patched"] == "refuse"
    assert d["verdict"] == "unsafe"
    assert all({"step", "rule", "value", "reason"} <= x.keys() for x in d["decisions"])
    assert r.err == ""


def test_ratio_auto_and_hicache_size_with_unit(cli):
    auto = json.loads(cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "--ratio", "auto", "-f", "json").out)
    assert auto["hicache"]["ratio"] == auto["recommended_ratio"] == 1.45
    sized = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "--hicache-size", "4GB", "-f", "json").out)
    assert sized["hicache"]["size_gb"] == 4


def test_plan_ratio_1_ok_and_auto(cli):
    one = cli("plan", "-p", "rtx5060ti-tp2", "--ratio", "1", "--host-ram", "16GiB", "--wsl2", "-f", "json")
    assert one.code == 0 and json.loads(one.out)["pinned_total_bytes"] == 5_197_627_392
    auto = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2")
    assert auto.code == 0
    assert "--hicache-ratio 1.45" in auto.out and "verdict: ok" in auto.out
    assert "largest safe ratio: 1.48" in auto.out
    assert "refuse" in auto.out  # the stock runtime's refusal is reported


def test_plan_against_this_host(cli):
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "-f", "json")
    d = json.loads(r.out)
    assert d["host_source"] == "live"
    assert d["budget"]["memory_base_bytes"] <= read_meminfo()["MemTotal"]
    assert r.code == (3 if d["verdict"] == "unsafe" else 0)


def test_hicache_off_exits_0_and_says_so(cli):
    # the fp8 profile sized for WSL2's hidden VRAM; 10 GiB: the policy's reserves (2 x 3 + 1 + 2
    # GiB) fit, ratio 1's pools do not
    sized = [a for kv in ("runtime.mem_fraction_static=0.82", "runtime.max_total_tokens=24576",
                          "runtime.context_length=24576") for a in ("--set", kv)]
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "10GiB", "--wsl2", *sized, "-f", "json")
    d = json.loads(r.out)
    assert (r.code, d["verdict"], d["hicache"]["enabled"]) == (0, "hicache_off", False)
    assert d["max_safe_ratio"] < 1.0 and d["ratio_cap"] == 4.0


def test_plan_marks_declared_flags(cli):
    d = json.loads(cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "-f", "json").out)
    assert any(x.startswith("--kv-cache-dtype int2 (int2-kv)") for x in d["argv_check"]["declared"])
    assert d["argv_check"]["verified"] > 20


@pytest.mark.parametrize("args,needle", [
    (["--ratio", "-1"], "--ratio: must be a finite number greater than 0 (got -1)"),
    (["--ratio", "nan"], "--ratio: expected a number > 0 or auto, in plain decimal (got 'nan')"),
    (["--ratio", "abc"], "--ratio: expected a number > 0 or auto"),
    (["--hicache-size", "4GiB"], "--hicache-size: expected a whole number of GB"),
    (["--host-ram", "16"], "--host-ram: a bare number is ambiguous"),
    (["--host-ram", "16Gi"], "--host-ram: unknown unit 'Gi'"),
    (["--wsl2", "--linux"], "--wsl2 and --linux are mutually exclusive"),
    (["--profile", "nope"], "unknown profile 'nope': known profiles are linux-tp2-l3, rtx5060ti-tp2, rtx5060ti-tp2-fp8"),
    (["--set", "hicache.hicache_ratio=-2"], "--set hicache.hicache_ratio: Input should be 'auto' or greater than 0 (got -2)"),
    (["--set", "hicache.hicache_ration=2"], "--set hicache.hicache_ration: unknown key (did you mean hicache_ratio?)"),
])
def test_bad_input_one_line_exit_2(cli, args, needle):
    r = cli("plan", *(["--profile", "rtx5060ti-tp2"] if "--profile" not in args else []), *args)
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert lines[0].startswith("error: ") and needle in lines[0]
    assert "Traceback" not in r.err and r.out == ""


def test_bad_profile_file_lists_every_error_with_file_line(cli, tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("extends: rtx5060ti-tp2\nname: p\nsafety:\n  os_reserve: 1\n  page_cache_floor: 2Gi\nbogus: 1\n")
    r = cli("plan", "--profile", str(f))
    assert r.code == 2
    errs = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
    assert [e.split(": ")[1] for e in errs] == [f"{f}:4", f"{f}:5", f"{f}:6"]


def test_profiles_list_show_validate(cli):
    r = cli("profiles", "list", "--format", "json")
    assert [x["name"] for x in json.loads(r.out)] == ["linux-tp2-l3", "rtx5060ti-tp2", "rtx5060ti-tp2-fp8",
                                                      "rtx5090-tp2-mtp3-l3"]
    show = cli("profiles", "show", "rtx5060ti-tp2-fp8", "-f", "json")
    assert json.loads(show.out)["runtime"]["kv_cache"]["dtype"] == "fp8_e4m3"
    assert cli("profiles", "validate").code == 0


def test_profiles_validate_fails_on_a_bad_file(cli, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: bad\nhardware: {gpu_name: x, gpu_count: 0, gpu_vram: 1GiB}\n")
    r = cli("profiles", "validate", str(f))
    assert r.code == 2 and f"{f}:2: hardware.gpu_count" in r.err


@pytest.mark.parametrize("name", ["rtx5060ti-tp2", "rtx5060ti-tp2-fp8", "linux-tp2-l3"])
def test_profiles_show_round_trips(cli, tmp_path, name):
    from escha_deploy.profile import load_profile

    shown = cli("profiles", "show", name)
    assert shown.code == 0
    f = tmp_path / "shown.yaml"
    f.write_text(shown.out)
    assert cli("profiles", "validate", str(f)).code == 0
    assert load_profile(str(f)) == load_profile(name)


@pytest.mark.parametrize("fmt", ["table", "json"])
@pytest.mark.parametrize("where, reason", [
    ("{w}/no/such/f.json", "No such file or directory"),
    ("{w}", "Is a directory"),
    ("{w}/file/f.json", "Not a directory"),
    ("/proc/version", None),  # EIO as root (the kernel refuses the write), EACCES otherwise
])
def test_write_facts_that_cannot_be_written_is_one_line_exit_2(cli, tmp_path, where, reason, fmt):
    """`--write-facts` answers as `compose -o` does: one line naming the option and the path,
    exit 2, no traceback, nothing on stdout (even with --format json), nothing created."""
    w = tmp_path / "w"
    w.mkdir()
    (w / "file").write_text("keep\n")
    proc = open("/proc/version").read()
    path = where.format(w=w)
    r = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "--write-facts", path, "-f", fmt)
    assert r.code == 2, r.err
    assert "Traceback" not in r.err and r.out == ""
    [line] = r.err.splitlines()
    assert line.startswith(f"error: --write-facts {path}: cannot write: "), line
    if reason:
        assert line == f"error: --write-facts {path}: cannot write: {reason}"
    assert sorted(p.name for p in w.rglob("*")) == ["file"] and (w / "file").read_text() == "keep\n"
    assert open("/proc/version").read() == proc


def test_write_facts_replaces_a_file_and_says_where(cli, tmp_path):
    out = tmp_path / "facts.json"
    out.write_text("old")
    r = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "--write-facts", str(out), "-f", "json")
    assert r.code == 0, r.err
    assert json.loads(out.read_text())["schema_version"] == 1
    assert f"plan: wrote the facts this plan used to {out}" in r.err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "xdg-cache") == ["facts.json"]


def test_plan_names_a_model_folder_of_another_architecture(cli, tmp_path):
    """A Llama folder behind a hybrid GDN profile: the table says the sizes are the folder's model."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "hidden_size": 4096, "head_dim": 128}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={tmp_path}", "--host-ram", "24GiB")
    assert r.code == 0, r.err
    w = [ln for ln in r.out.splitlines() if ln.startswith("  warning: model: ")]
    assert len(w) == 1, r.out
    assert "llama (dense: 32 layers" in w[0] and "model.architecture qwen3_5_text (hybrid GDN" in w[0]
    d = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", f"model.host_dir={tmp_path}", "--host-ram",
                       "24GiB", "-f", "json").out)
    assert d["hybrid"] is False and any("config.json" in x for x in d["warnings"])


@pytest.mark.parametrize("override, line", [
    ("hicache=1", "error: --set hicache: expected a mapping of hicache keys (got 1)"),
    ("runtime=foo", "error: --set runtime: expected a mapping of runtime keys (got 'foo')"),
])
def test_a_section_set_to_a_scalar_is_named_in_profile_words(cli, override, line):
    """pydantic's "valid dictionary or instance of HiCache" named a class users never see."""
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "24GiB", "--set", override)
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines() == [line]


@pytest.mark.parametrize(("args", "code"), [
    (("--ratio", "2"), 3),  # unsafe: the exit code survives the closed pipe
    (("--ratio", "1"), 0),
    (("--ratio", "1", "--format", "json"), 0),
])
def test_a_reader_that_closes_the_pipe_keeps_the_exit_code(args, code):
    """`escha-deploy plan | head -1`: the reader is gone before the output is written; the
    command ends with its own exit code and nothing on stderr (no BrokenPipeError, no exit 1)."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # a reader that has already gone: every write fails with EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "escha_deploy", "plan", "--profile", "rtx5060ti-tp2",
                            "--host-ram", "16GiB", "--wsl2", *args],
                           stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == code, p.stderr
    # a table names the shipped file it read (one line, before the plan); nothing else
    said = [] if "json" in args else ["plan: profile rtx5060ti-tp2 read from the shipped file"]
    assert [ln.split(" /")[0] for ln in p.stderr.splitlines()] == said


def test_ratio_replaces_a_profile_files_hicache_size_and_says_where_it_was(cli):
    # linux-tp2-l3 sets hicache_size: 30: --ratio 1 plans the ratio, with a warning naming the line
    r = cli("plan", "-p", "linux-tp2-l3", "--ratio", "1", "--host-ram", "128GiB", "-f", "json")
    d = json.loads(r.out)
    assert (d["hicache"]["ratio"], d["hicache"]["size_gb"], d["hicache"]["requested"]) == (1.0, None, "hicache_ratio 1.0 (--ratio)")
    assert d["warnings"][0].startswith("--ratio 1 replaces the profile's hicache_size 30 (")
    assert "profiles/linux-tp2-l3.yaml:50)" in d["warnings"][0]
    # without --ratio the size is the profile file's, and the label names its line, not "command line"
    plain = json.loads(cli("plan", "-p", "linux-tp2-l3", "--host-ram", "128GiB", "-f", "json").out)
    assert plain["hicache"]["size_gb"] == 30
    assert plain["hicache"]["requested"].startswith("hicache_size 30 GB per rank (")
    assert plain["hicache"]["requested"].endswith("profiles/linux-tp2-l3.yaml:50)")
    sized = json.loads(cli("plan", "-p", "linux-tp2-l3", "--hicache-size", "8", "--host-ram", "128GiB", "-f", "json").out)
    assert sized["hicache"]["requested"] == "hicache_size 8 GB per rank (--hicache-size)"
    via_set = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--set", "hicache.hicache_size=2", "--host-ram", "64GiB",
                             "-f", "json").out)
    assert via_set["hicache"]["requested"] == "hicache_size 2 GB per rank (--set hicache.hicache_size)"


@pytest.mark.parametrize("args, line", [
    (["-p", "linux-tp2-l3", "--ratio", "1", "--set", "hicache.hicache_size=20"],
     "error: --ratio 1 and --set hicache.hicache_size=20 are mutually exclusive"),
    (["-p", "linux-tp2-l3", "--ratio", "auto", "--set", "hicache.hicache_size=20"],
     "error: --ratio auto and --set hicache.hicache_size=20 are mutually exclusive"),
    (["-p", "linux-tp2-l3", "--ratio", "1", "--set", "hicache.enabled=false"],
     "error: --ratio 1 and --set hicache.enabled=false are mutually exclusive"),
    (["-p", "linux-tp2-l3", "--hicache-size", "4", "--set", "hicache.enabled=false"],
     "error: --hicache-size 4 and --set hicache.enabled=false are mutually exclusive"),
    (["-p", "rtx5060ti-tp2-fp8", "--hicache-size", "4", "--set", "hicache.hicache_ratio=2"],
     "error: --hicache-size 4 and --set hicache.hicache_ratio=2 are mutually exclusive"),
])
def test_a_hicache_option_against_a_set_saying_otherwise_is_refused(cli, args, line):
    r = cli("plan", *args, "--host-ram", "128GiB")
    assert r.code == 2 and r.out == ""
    assert r.err.startswith(line) and "Traceback" not in r.err


def test_ratio_on_a_profile_file_with_hicache_off_is_refused_naming_the_line(cli, tmp_path):
    f = tmp_path / "off.yaml"
    f.write_text("extends: rtx5060ti-tp2-fp8\nname: hc-off\nhicache:\n  enabled: false\n")
    r = cli("plan", "-p", str(f), "--ratio", "1", "--host-ram", "64GiB")
    assert r.code == 2
    assert f"--ratio 1: HiCache is off ({f}:4: hicache.enabled: false)" in r.err
    plain = json.loads(cli("plan", "-p", str(f), "--host-ram", "64GiB", "-f", "json").out)
    assert plain["hicache"]["requested"] == f"disabled in the profile ({f}:4)"


def test_a_facts_file_from_the_environment_is_named_by_the_variable(cli, monkeypatch, tmp_path):
    missing = tmp_path / "nonexistent.json"
    monkeypatch.setenv("ESCHA_FACTS", str(missing))
    r = cli("plan")
    assert r.code == 2 and r.out == ""
    assert r.err.startswith(f"error: ESCHA_FACTS={missing}: cannot read the facts file")
    r = cli("plan", "--host-ram", "8GiB")
    assert (r.code, r.err.splitlines()[0]) == (
        2, f"error: ESCHA_FACTS={missing} and --host-ram are mutually exclusive (the facts file describes the host)")
    # --facts given: the option's file, no variable named
    r = cli("plan", "--facts", str(missing))
    assert r.code == 2 and r.err.startswith(f"error: {missing}: cannot read the facts file")


def test_a_piped_plan_keeps_its_header_lines_whole(cli, monkeypatch):
    """Piped (not a terminal), rich wraps at 80 columns; the header's file:line (where the ratio
    came from) must stay on one line, whole, to be copied or grepped."""
    monkeypatch.setenv("COLUMNS", "80")
    r = cli("plan", "--profile", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    # the answer's five lines lead (each whole too), then the header
    assert lines[0].startswith("verdict: ok") and lines[4].startswith("next: ") and lines[4].endswith("`"), lines[:5]
    first = lines[5]
    assert first.startswith("rtx5060ti-tp2  TP 2,") and re.search(r"rtx5060ti-tp2\.yaml:\d+\)\)$", first), first
