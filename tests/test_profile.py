"""Profile loading: extends, overrides, and one clear line per error naming file:line and key."""

import textwrap
from pathlib import Path

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.profile import Profile, list_profiles, load_profile, profile_json_schema

SHIPPED = ["linux-tp2-l3", "rtx5060ti-tp2", "rtx5060ti-tp2-fp8", "rtx5090-tp2-mtp3-l3"]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def errors_of(ref, overrides=()):
    with pytest.raises(BadInput) as exc:
        load_profile(str(ref), overrides)
    return list(exc.value.problems)


def test_shipped_profiles_load():
    assert list_profiles() == SHIPPED
    for name in SHIPPED:
        assert load_profile(name).name == name


def test_extends_merges_then_validates_once():
    fp8 = load_profile("rtx5060ti-tp2-fp8")
    ref = load_profile("rtx5060ti-tp2")
    assert fp8.hardware == ref.hardware  # inherited whole
    assert fp8.model.architecture == ref.model.architecture  # inherited inside a merged section
    assert fp8.model.path != ref.model.path  # overridden inside the same section
    assert fp8.runtime.kv_cache.dtype == "fp8_e4m3" and fp8.runtime.kv_cache.int2 == ref.runtime.kv_cache.int2
    assert "int2-kv" not in fp8.runtime.needs


def test_set_overrides_parse_yaml_values():
    p = load_profile("rtx5060ti-tp2", ["hicache.hicache_ratio=1.5", "runtime.needs=[int2-kv]", "safety.os_reserve=2GiB"])
    assert p.hicache.hicache_ratio == 1.5
    assert p.runtime.needs == ["int2-kv"]
    assert p.safety.os_reserve == 2 * 2**30


def test_profiles_are_frozen():
    p = load_profile("rtx5060ti-tp2")
    with pytest.raises(Exception):
        p.runtime.tp_size = 4


def test_malformed_yaml_names_file_and_line(tmp_path):
    f = write(tmp_path, "bad.yaml", """\
        name: bad
        hardware:
          gpu_name: [unclosed
        """)
    (line,) = errors_of(f)
    assert line.startswith(f"{f}:4: malformed YAML") or line.startswith(f"{f}:3: malformed YAML")


def test_unknown_key_names_its_line(tmp_path):
    f = write(tmp_path, "typo.yaml", """\
        extends: rtx5060ti-tp2
        name: typo
        hicache:
          hicache_ration: 2
        """)
    assert errors_of(f) == [f"{f}:4: hicache.hicache_ration: unknown key (did you mean hicache_ratio?)"]


def test_bad_unit_and_bare_number_each_get_a_line(tmp_path):
    f = write(tmp_path, "units.yaml", """\
        extends: rtx5060ti-tp2
        name: units
        safety:
          os_reserve: 1Gi
          page_cache_floor: 2
        """)
    lines = errors_of(f)
    assert len(lines) == 2
    assert lines[0].startswith(f"{f}:4: safety.os_reserve: unknown unit 'Gi'")
    assert lines[1].startswith(f"{f}:5: safety.page_cache_floor: a bare number is ambiguous: write 2GiB or 2GB")


def test_negative_ratio(tmp_path):
    f = write(tmp_path, "neg.yaml", """\
        extends: rtx5060ti-tp2
        name: neg
        hicache:
          hicache_ratio: -1
        """)
    (line,) = errors_of(f)
    assert line.startswith(f"{f}:4: hicache.hicache_ratio:") and "greater than 0" in line


def test_missing_required_key_points_at_its_parent(tmp_path):
    f = write(tmp_path, "missing.yaml", """\
        name: missing
        hardware:
          gpu_name: X
          gpu_count: 1
        model:
          path: /m
          weights_per_rank: 1GB
          architecture: {model_type: llama, num_hidden_layers: 2, num_key_value_heads: 2, head_dim: 64}
        """)
    assert errors_of(f) == [f"{f}:2: hardware.gpu_vram: required key is missing"]


def test_errors_from_a_parent_name_the_parent_file(tmp_path):
    parent = write(tmp_path, "parent.yaml", """\
        extends: rtx5060ti-tp2
        name: parent
        runtime:
          tp_size: zero
        """)
    child = write(tmp_path, "child.yaml", """\
        extends: ./parent.yaml
        name: child
        """)
    (line,) = errors_of(child)
    assert line.startswith(f"{parent.resolve()}:4: runtime.tp_size:")


def test_set_override_errors_name_the_option():
    lines = errors_of("rtx5060ti-tp2", ["runtime.tp_size=-2"])
    assert lines == ["--set runtime.tp_size: Input should be greater than 0 (got -2)"]


@pytest.mark.parametrize("item, line", [
    # a section the override creates is the override's: never the shipped file's top line
    ("server.tp_size=4", "--set server.tp_size: unknown key server"),
    ("foo.bar=1", "--set foo.bar: unknown key foo"),
    ("runtime.foo.bar=1", "--set runtime.foo.bar: unknown key runtime.foo"),
    ("runtim.tp_size=2", "--set runtim.tp_size: unknown key runtim (did you mean runtime?)"),
    ("runtime.kv_cache.int3.x=1", "--set runtime.kv_cache.int3.x: unknown key runtime.kv_cache.int3 (did you mean int2?)"),
    # the last key unknown, in a section the file has: as before
    ("hardware.tp_size=4", "--set hardware.tp_size: unknown key (got 4)"),
    ("runtime.tp_sise=2", "--set runtime.tp_sise: unknown key (did you mean tp_size?)"),
])
def test_set_unknown_key_is_blamed_on_the_set(item, line):
    assert errors_of("rtx5060ti-tp2", [item]) == [line]


def test_set_unknown_key_under_a_file_profile(tmp_path):
    child = write(tmp_path, "child.yaml", "extends: rtx5060ti-tp2\nname: child\n")
    assert errors_of(child, ["server.tp_size=4"]) == ["--set server.tp_size: unknown key server"]


def test_a_bad_name_from_the_file_name_blames_that_file_in_words(tmp_path):
    child = write(tmp_path, "my profile.yaml", "extends: rtx5060ti-tp2-fp8\n")
    assert errors_of(child) == [
        f"{child.resolve()}: name: the profile name comes from the file name 'my profile'; names are letters, "
        "digits, '_', '.', '-' (at most 63, starting with a letter or digit): add `name:`"]
    # the fix the line names works
    child.write_text("extends: rtx5060ti-tp2-fp8\nname: my-profile\n")
    assert load_profile(str(child)).name == "my-profile"


def test_a_bad_written_name_is_named_at_its_line_in_words(tmp_path):
    child = write(tmp_path, "c.yaml", "extends: rtx5060ti-tp2-fp8\nname: a b\n")
    assert errors_of(child) == [f"{child.resolve()}:2: name: 'a b' is not a profile name: names are letters, "
                                "digits, '_', '.', '-' (at most 63, starting with a letter or digit)"]
    # --set name=... over a file without name: the --set is to blame, not the file name
    bare = write(tmp_path, "ok.yaml", "extends: rtx5060ti-tp2-fp8\n")
    (line,) = errors_of(bare, ["name=a b"])
    assert line.startswith("--set name: 'a b' is not a profile name")


def test_unknown_profile_lists_known_ones():
    (line,) = errors_of("rtx9999")
    assert line == "unknown profile 'rtx9999': known profiles are " + ", ".join(SHIPPED)


def test_a_file_in_the_current_folder_is_read_by_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rt.json").write_text('{"extends": "rtx5060ti-tp2", "name": "rt-json"}')
    (tmp_path / "plain").write_text("extends: rtx5060ti-tp2\nname: plain\n")
    assert load_profile("rt.json").name == "rt-json"  # a .json suffix: a file
    assert load_profile("plain").name == "plain"  # no suffix, not a shipped name, exists: a file
    assert errors_of("nope.json") == ["nope.json: no such profile file"]


def test_a_shipped_name_wins_over_a_file_of_that_name(tmp_path, monkeypatch):
    from escha_deploy.pipeline import profile_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rtx5060ti-tp2").write_text("extends: rtx5060ti-tp2\nname: local\n")
    assert load_profile("rtx5060ti-tp2").name == "rtx5060ti-tp2"
    assert profile_file("rtx5060ti-tp2") is None  # up mounts nothing: the image has the shipped one
    assert load_profile("./rtx5060ti-tp2").name == "local"
    (tmp_path / "rt.json").write_text('{"extends": "rtx5060ti-tp2", "name": "rt-json"}')
    assert profile_file("rt.json") == str((tmp_path / "rt.json").resolve())  # up mounts what plan read


def test_dot_slash_name_reads_the_file_or_its_yaml_and_an_error_keeps_the_path_as_typed(cli, tmp_path, monkeypatch):
    """The help says "./NAME reads the file": `plan -p ./good` beside good.yaml plans it (it
    failed "good: no such profile file", the ./ dropped); a file named exactly NAME wins, and
    what is missing is named as typed with the names tried."""
    from escha_deploy.pipeline import profile_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.yaml").write_text("extends: rtx5060ti-tp2-fp8\nname: good\n")
    r = cli("plan", "-p", "./good", "--host-ram", "64GiB")
    assert r.code == 0, r.err
    assert r.out.splitlines()[5].startswith("good  TP 2")  # after the plan's five answer lines
    assert "`escha-deploy up -p ./good --dry-run`" in r.out.splitlines()[4]  # the next line names it as typed
    assert profile_file("./good") == str((tmp_path / "good.yaml").resolve())  # up mounts the file plan read
    (tmp_path / "j.json").write_text('{"extends": "rtx5060ti-tp2-fp8", "name": "j"}')
    assert load_profile("./j").name == "j"
    (tmp_path / "good").write_text("extends: rtx5060ti-tp2-fp8\nname: exact\n")
    assert load_profile("./good").name == "exact"  # the file as typed, when there is one
    r = cli("plan", "-p", "./nope")
    assert (r.code, r.err.splitlines()[0]) == (2, "error: ./nope: no such profile file (nor ./nope.yaml, "
                                                  "./nope.yml, ./nope.json)")
    assert cli("plan", "-p", "./nope.yaml").err.splitlines()[0] == "error: ./nope.yaml: no such profile file"
    help_text = " ".join(cli("plan", "--help").out.split())
    assert "(./NAME reads the file NAME, else NAME.yaml, NAME.yml or NAME.json)" in help_text


def test_extends_reads_a_bare_file_name_next_to_the_child(tmp_path):
    (tmp_path / "base").write_text("extends: rtx5060ti-tp2\nname: base\nruntime:\n  tp_size: 1\n")
    child = write(tmp_path, "c.yaml", "extends: base\nname: c\n")
    assert load_profile(str(child)).runtime.tp_size == 1


def test_extends_cycle_is_refused(tmp_path):
    write(tmp_path, "a.yaml", "extends: ./b.yaml\nname: a\n")
    write(tmp_path, "b.yaml", "extends: ./a.yaml\nname: b\n")
    (line,) = errors_of(tmp_path / "a.yaml")
    assert "extends itself" in line


def test_every_field_is_documented():
    """A docs-drift check (style-anchors rule 16): every profile field has a description."""
    schema = profile_json_schema()
    missing = []
    for name, model in schema["$defs"].items():
        for field, spec in model.get("properties", {}).items():
            if "description" not in spec and not ("$ref" in spec or "allOf" in spec):
                missing.append(f"{name}.{field}")
    assert missing == []


def test_committed_json_schema_is_current():
    import json

    from escha_deploy.utils.paths import catalog_dir

    committed = json.loads((catalog_dir() / "profile.schema.json").read_text())
    assert committed == profile_json_schema(), "run: python scripts/gen_profile_schema.py"


def test_shipped_profiles_carry_the_schema_modeline():
    from escha_deploy.utils.paths import profiles_dir

    for f in profiles_dir().glob("*.yaml"):
        assert "yaml-language-server: $schema=../escha_deploy/catalog/profile.schema.json" in f.read_text().splitlines()[0]


def test_reference_profile_documents_every_section_key():
    """The commented reference profile names every key of the sections it sets."""
    from escha_deploy.utils.paths import profiles_dir

    text = (profiles_dir() / "rtx5060ti-tp2.yaml").read_text()
    for section in ("hardware", "hicache", "safety"):
        model = Profile.model_fields[section].annotation
        for field in model.model_fields:
            if field in ("storage_dir", "storage_max_size", "max_ratio", "min_ratio"):
                continue  # documented in linux-tp2-l3.yaml and profile/models.py
            assert f"  {field}:" in text, f"{section}.{field} missing from the reference profile"


def test_defaults_are_bytes_like_written_values():
    """A profile that leaves `safety` out gets the same policy, in bytes, as the reference
    profile that spells the documented defaults out (pydantic does not re-validate defaults,
    so they must be ints already, not "3GiB")."""
    from escha_deploy.profile import Safety

    assert Safety() == load_profile("rtx5060ti-tp2").safety
    assert all(isinstance(v, int) for k, v in Safety().model_dump().items()
               if k not in ("ratio_step", "wsl2_mem_fraction_drop"))  # the two fractions


def test_hicache_size_is_written_like_the_cli_takes_it(tmp_path):
    """SGLang's --hicache-size is an int in GB per rank (flag catalog: "type": "int"); the profile
    key, --set and `plan --hicache-size` read it through one parser: 7, '7', '7GB', '7 gb'."""
    f = write(tmp_path, "size.yaml", """\
        extends: rtx5060ti-tp2
        hicache:
          hicache_size: 7GB
        """)
    assert load_profile(str(f)).hicache.hicache_size == 7
    for text in ("7GB", "7", "7 gb"):
        assert load_profile("rtx5060ti-tp2", [f"hicache.hicache_size={text}"]).hicache.hicache_size == 7
    assert load_profile("rtx5060ti-tp2", ["hicache.hicache_size=0"]).hicache.hicache_size == 0
    for bad in ("7GiB", "7.5", "-1", "true"):
        [problem] = errors_of("rtx5060ti-tp2", [f"hicache.hicache_size={bad}"])
        assert "hicache.hicache_size" in problem and "whole number of GB" in problem, problem


def test_hicache_size_schema_accepts_what_the_model_accepts():
    schema = profile_json_schema()["$defs"]["HiCache"]["properties"]["hicache_size"]
    import re

    [integer, text] = schema["anyOf"]
    assert integer == {"type": "integer", "minimum": 0, "maximum": 10**6}
    assert all(re.match(text["pattern"], s) for s in ("7GB", "7", "7 gb"))
    assert not any(re.match(text["pattern"], s) for s in ("7GiB", "7.5", "GB"))
