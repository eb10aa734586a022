"""yamlpos: one libyaml parse per file, positions kept, hostile YAML refused in one line, fast."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from escha_deploy.utils import yamlpos
from escha_deploy.utils.errors import BadInput
from escha_deploy.profile import load_profile
from escha_deploy.utils.yamlpos import MAX_FILE_BYTES, MAX_NODES, load_yaml_with_positions, parse_yaml_text

REPO = Path(__file__).resolve().parents[1]


def one_line(exc: pytest.ExceptionInfo) -> str:
    assert len(exc.value.problems) == 1, exc.value.problems
    return exc.value.problems[0]


def billion_laughs(levels: int = 9, fan: int = 9) -> str:
    """Nine levels of nine aliases: 9**9 = 387,420,489 leaves when expanded, about 300 bytes."""
    lines = ["a: &a [" + ", ".join(["lol"] * fan) + "]"]
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * fan) + "]")
    return "\n".join(lines) + "\n"


def test_the_c_loader_is_used_and_data_matches_safe_load():
    assert issubclass(yamlpos._Loader, yaml.CSafeLoader)  # libyaml, plus one resolver (2e9)
    for f in sorted((REPO / "profiles").glob("*.yaml")):
        data, pos = load_yaml_with_positions(f)
        assert data == yaml.safe_load(f.read_text())
        for key in data:
            assert pos[(key,)][1] == next(i for i, ln in enumerate(f.read_text().splitlines(), 1)
                                          if ln.startswith(f"{key}:"))


def test_positions_name_key_lines_and_list_items():
    data, pos = parse_yaml_text("a:\n  b: 1\n  c:\n    - x\n    - y\n", "f.yaml")
    assert data == {"a": {"b": 1, "c": ["x", "y"]}}
    assert pos[("a", "b")] == ("f.yaml", 2)
    assert pos[("a", "c", 1)] == ("f.yaml", 5)


def test_one_parse_is_fast():
    """A shipped profile parses in well under the 14-26 ms the pure-Python double parse took."""
    f = REPO / "profiles" / "rtx5060ti-tp2.yaml"
    load_yaml_with_positions(f)
    # this process's CPU time, not the wall clock: beside other test workers on two cores the
    # wall clock read 7.3 ms for what takes under 5 ms of CPU
    t0 = time.process_time()
    for _ in range(20):
        load_yaml_with_positions(f)
    per_file = (time.process_time() - t0) / 20
    assert per_file < 0.005, f"{per_file * 1000:.1f} ms of CPU per file"


def test_billion_laughs_fails_fast_in_one_line():
    text = billion_laughs()
    assert len(text) < 4096
    t0 = time.perf_counter()
    with pytest.raises(BadInput) as exc:
        parse_yaml_text(text, "lol.yaml")
    assert time.perf_counter() - t0 < 0.5
    assert f"more than {MAX_NODES} nodes" in one_line(exc) and one_line(exc).startswith("lol.yaml:")


def test_a_few_aliases_still_work():
    data, _ = parse_yaml_text("base: &b {x: 1}\nc:\n  <<: *b\n  y: 2\nd: [*b, *b]\n", "f")
    assert data["c"] == {"x": 1, "y": 2} and data["d"] == [{"x": 1}, {"x": 1}]


def test_recursive_alias_and_deep_nesting_are_refused():
    with pytest.raises(BadInput) as exc:
        parse_yaml_text("a: &a [*a]\n", "r.yaml")
    assert "refers to its own anchor" in one_line(exc)
    with pytest.raises(BadInput) as exc:
        parse_yaml_text("".join(" " * i + f"k{i}:\n" for i in range(100)), "d.yaml")
    assert "nested deeper than" in one_line(exc)
    with pytest.raises(BadInput) as exc:
        parse_yaml_text("a: " + "[" * 100_000 + "]" * 100_000, "d.yaml")
    assert one_line(exc).startswith("d.yaml:1:")


def test_duplicate_keys_name_both_lines():
    text = "name: x\nhicache:\n  enabled: true\nruntime: {}\nhicache:\n  hicache_ratio: 2\n"
    with pytest.raises(BadInput) as exc:
        parse_yaml_text(text, "dup.yaml")
    assert one_line(exc).startswith("dup.yaml:5: duplicate key 'hicache' (first at line 2)")
    with pytest.raises(BadInput) as exc:  # nested, and two of them: two lines
        parse_yaml_text("a:\n  b: 1\n  b: 2\nc: 1\nc: 2\n", "dup.yaml")
    assert [p.split(":")[1] for p in exc.value.problems] == ["3", "5"]


def test_not_utf8_names_the_byte_offset(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes(b"name: x\ndescription: caf\xe9\n")
    with pytest.raises(BadInput) as exc:
        load_yaml_with_positions(f)
    assert one_line(exc) == f"{f}:2: not UTF-8 text: byte 0xe9 at offset 24; save the profile as UTF-8"


def test_size_cap_reads_no_more_than_the_cap(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_bytes(b"# " + b"x" * (MAX_FILE_BYTES * 4))
    with pytest.raises(BadInput) as exc:
        load_yaml_with_positions(f)
    assert "larger than 256 KiB" in one_line(exc)


def test_directory_and_missing_extends_are_named(tmp_path):
    with pytest.raises(BadInput) as exc:
        load_profile(str(tmp_path))
    assert one_line(exc) == f"{tmp_path}: is a directory, not a profile file"
    child = tmp_path / "child.yaml"
    child.write_text("name: c\n\nextends: ./gone.yaml\n")
    with pytest.raises(BadInput) as exc:
        load_profile(str(child))
    assert one_line(exc) == f"{child}:3: extends: {tmp_path / 'gone.yaml'}: no such profile file"
    child.write_text("extends: no-such-shipped-profile\n")
    with pytest.raises(BadInput) as exc:
        load_profile(str(child))
    assert one_line(exc).startswith(f"{child}:1: extends: unknown profile 'no-such-shipped-profile'")


@pytest.mark.parametrize("text, fragment", [
    ("n: 0b1010", "f.yaml:1: 0b1010 is a binary number, which YAML 1.1 reads as 10"),
    ("n: 012", "f.yaml:1: 012 is an octal number (a leading zero), which YAML 1.1 reads as 10"),
    ("n: 0x1f", "f.yaml:1: 0x1f is a hexadecimal number, which YAML 1.1 reads as 31"),
    ("n: 1:30", "f.yaml:1: 1:30 is a base-60 (sexagesimal) number, which YAML 1.1 reads as 90"),
    ("a:\n  n: 1_000", "f.yaml:2: 1_000 is a number written with '_' separators, which YAML 1.1 reads as 1000"),
    ("n: 1_5.0", "f.yaml:1: 1_5.0 is a number written with '_' separators, which YAML 1.1 reads as 15.0"),
    ("n: -0b1", "f.yaml:1: -0b1 is a binary number"),
    ("n: [1, !!int 0b11]", "f.yaml:1: 0b11 is a binary number"),
])
def test_yaml11_number_spellings_are_refused(text, fragment):
    """PyYAML reads YAML 1.1 (yaml.org/type/int.html): these are numbers to it, silently; here
    they are one line naming the file and line."""
    with pytest.raises(BadInput) as exc:
        parse_yaml_text(text, "f.yaml")
    assert exc.value.message.startswith(fragment), exc.value.message
    assert exc.value.message.endswith("write the number in plain decimal (or quote it if it is text)")


@pytest.mark.parametrize("text, value", [
    ("n: 10", 10), ("n: -3", -3), ("n: 0", 0), ("n: 1.5", 1.5), ("n: .5", 0.5), ("n: 2e9", 2e9),
    ("n: 1e-3", 1e-3), ("n: 1.5e3", 1500.0), ("n: .5e1", 5.0), ("n: 0o17", "0o17"), ("n: '0b1010'", "0b1010"), ("n: 1_000x", "1_000x"),
    ("n: .inf", float("inf")),  # read here; the models refuse it by name (allow_inf_nan=False)
])
def test_plain_numbers_read_as_written(text, value):
    assert parse_yaml_text(text, "f.yaml")[0] == {"n": value}


def test_a_text_parsed_again_is_a_copy_its_caller_may_change(tmp_path):
    """The same text is parsed once per process (``parse_yaml_text`` keeps it): each caller gets
    its own data and positions, what an alias shares stays shared within one copy, and an edited
    file is read as edited."""
    text = "base: &b {x: 1}\nc: [*b, *b]\nd: {e: [1, 2]}\n"
    first, first_pos = parse_yaml_text(text, "f.yaml")
    first["d"]["e"].append(3)
    first["c"][0]["x"] = 9
    first_pos[("d", "e")] = ("elsewhere", 99)
    second, second_pos = parse_yaml_text(text, "f.yaml")
    assert second == {"base": {"x": 1}, "c": [{"x": 1}, {"x": 1}], "d": {"e": [1, 2]}}
    assert second_pos[("d", "e")] == ("f.yaml", 3)
    assert second["c"][0] is second["c"][1] is second["base"]  # the alias, as a fresh parse makes it
    f = tmp_path / "p.yaml"
    f.write_text("a: 1\n")
    assert load_yaml_with_positions(f)[0] == {"a": 1}
    f.write_text("a: 2\n")  # same size, written at once: read as it is now
    assert load_yaml_with_positions(f)[0] == {"a": 2}
    with pytest.raises(BadInput):  # a text that fails fails each time (nothing kept for it)
        parse_yaml_text("a: 1\na: 2\n", "dup.yaml")
    with pytest.raises(BadInput):
        parse_yaml_text("a: 1\na: 2\n", "dup.yaml")


def test_two_merge_sources_giving_one_key_two_values_are_refused():
    """YAML 1.1's merge type (yaml.org/type/merge.html) gives the first source's value; PyYAML
    gives the last's: such a file means two things, so it is one line naming the key."""
    text = "a: &a {port: 31000, x: 1}\nb: &b {port: 32000, x: 1}\nc:\n  <<: [*a, *b]\n"
    with pytest.raises(BadInput) as exc:
        parse_yaml_text(text, "p.yaml")
    assert exc.value.problems == (
        "p.yaml:4: merge key '<<': 'port' comes from two of its sources with different values (lines 1 "
        "and 2); YAML 1.1 takes the first, this reader the last: keep one",)


def test_merge_sources_that_agree_and_an_explicit_key_over_a_merge_are_read():
    data, _ = parse_yaml_text("a: &a {port: 1, x: 1}\nb: &b {x: 1, y: 2}\nc:\n  <<: [*a, *b]\n  port: 3\n", "p.yaml")
    assert data["c"] == {"port": 3, "x": 1, "y": 2}
