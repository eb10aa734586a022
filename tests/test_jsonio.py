"""The bounded JSON reader (escha_deploy/utils/jsonio.py): regular files only and never blocking, a size
cap that bounds what is read, a depth cap, unique keys, strict UTF-8 and strict numbers; each
refusal one BadInput line naming the file."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.utils.jsonio import MAX_JSON_DEPTH, loads_json, read_json, read_regular


def _refused(fn, *args, **kw) -> str:
    with pytest.raises(BadInput) as ei:
        fn(*args, **kw)
    assert len(ei.value.problems) == 1
    return ei.value.message


def _within(seconds: float, fn, *args, **kw):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) when it has not returned."""
    out: dict = {}

    def go():
        try:
            out["value"] = fn(*args, **kw)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["exc"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} blocked"
    if "exc" in out:
        raise out["exc"]
    return out.get("value")


def test_a_regular_file_reads(tmp_path):
    f = tmp_path / "f.json"
    f.write_text('\ufeff{"a": [1, 2.5, "x", null, true]}')  # a byte order mark is skipped (RFC 8259 8.1)
    assert read_json(f, "the facts file") == {"a": [1, 2.5, "x", None, True]}


def test_a_fifo_without_a_writer_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    msg = _within(5, _refused, read_json, fifo, "the facts file")
    assert msg == f"{fifo}: cannot read the facts file: a FIFO (named pipe), not a regular file"


@pytest.mark.parametrize("target, kind", [("/dev/zero", "a character device"), ("/dev/urandom", "a character device")])
def test_a_device_or_a_link_to_one_is_refused_before_reading(tmp_path, target, kind):
    link = tmp_path / "facts.json"
    link.symlink_to(target)
    for p in (target, link):
        assert _within(5, _refused, read_json, p, "the facts file") == \
            f"{p}: cannot read the facts file: {kind}, not a regular file"


def test_a_folder_and_a_missing_file_are_one_line(tmp_path):
    assert _refused(read_json, tmp_path, "the spec") == f"{tmp_path}: cannot read the spec: a folder, not a regular file"
    missing = tmp_path / "none.json"
    assert _refused(read_json, missing, "the spec") == f"{missing}: cannot read the spec: No such file or directory"
    assert read_regular(missing, "the spec", missing_ok=True) is None
    assert read_regular(tmp_path / "none" / "x", "the spec", missing_ok=True) is None
    long = tmp_path / ("x" * 4096)
    assert _refused(read_json, long, "the spec").endswith(": cannot read the spec: File name too long")
    through_file = tmp_path / "f"
    through_file.write_text("{}")
    assert read_regular(through_file / "x", "the spec", missing_ok=True) is None
    assert _refused(read_json, through_file / "x", "the spec").endswith("Not a directory")


def test_an_unsearchable_folder_is_one_line_even_with_missing_ok(tmp_path):
    """EACCES is not 'missing': a file in a folder this user may not search is refused. As root
    (CI), the capabilities that bypass permissions are dropped (util-linux setpriv)."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "f.json").write_text("{}")
    sub.chmod(0)
    code = ("import sys; from escha_deploy.utils.jsonio import read_regular; from escha_deploy.utils.errors import BadInput\n"
            "try: read_regular(sys.argv[1], 'the spec', missing_ok=True)\n"
            "except BadInput as e: print(e.message)\n")
    prefix = (["setpriv", "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else [])
    try:
        r = subprocess.run([*prefix, sys.executable, "-c", code, str(sub / "f.json")], capture_output=True, text=True,
                           timeout=60)
    finally:
        sub.chmod(0o755)
    assert r.stdout.strip() == f"{sub / 'f.json'}: cannot read the spec: Permission denied", r.stderr


def test_the_size_cap_bounds_what_is_read(tmp_path):
    f = tmp_path / "big.json"
    f.write_text("[" + " " * 98 + "]")  # 100 bytes
    assert read_json(f, "the facts file", max_bytes=100) == []
    assert _refused(read_json, f, "the facts file", max_bytes=99) == \
        f"{f}: cannot read the facts file: 100 bytes, larger than the 99 bytes read at most"


def test_a_file_that_grows_past_the_cap_while_read_is_refused():
    """/proc files report size 0 to fstat and then yield more: the read itself stops at the cap."""
    msg = _refused(read_regular, "/proc/self/status", "the facts file", max_bytes=16)
    assert msg == "/proc/self/status: cannot read the facts file: grew past the 16 bytes read at most while being read"


def test_the_depth_cap_whether_json_recurses_or_not(tmp_path):
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_json(ok, "f.json", "the spec") is not None
    for depth in (MAX_JSON_DEPTH + 1, 100_000):  # the second is past the C decoder's recursion limit
        deep = "[" * depth + "]" * depth
        assert _refused(loads_json, deep, "f.json", "the spec") == \
            f"f.json: the spec is nested deeper than {MAX_JSON_DEPTH} levels"
    mixed = '{"a": ' * 40 + "[" * 30 + "]" * 30 + "}" * 40
    assert _refused(loads_json, mixed, "f.json", "the spec").endswith("nested deeper than 64 levels")


def test_duplicate_keys_are_refused_at_any_depth():
    assert _refused(loads_json, '{"a": 1, "a": 2}', "f.json", "the facts file") == \
        "f.json: the facts file has the key 'a' twice in one object (JSON keys must be unique; " \
        "the last one would win silently)"
    assert "'memory'" in _refused(loads_json, '{"x": [{"memory": 1, "memory": {}}]}', "f.json", "the facts file")
    assert loads_json('{"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]}', "f.json", "x")  # same key, other objects


@pytest.mark.parametrize("text, shown", [("NaN", "NaN"), ('{"m": -Infinity}', "-Infinity"), ("[1e400]", "1e400")])
def test_numbers_json_does_not_have_are_refused(text, shown):
    assert _refused(loads_json, text, "f.json", "the spec") == \
        f"f.json: the spec is not JSON ({shown} is not a finite JSON number)"


def test_not_utf8_names_the_line_and_offset():
    assert _refused(loads_json, b'{\n"a": "caf\xe9"}', "f.json", "the spec") == \
        "f.json:2: the spec is not JSON (not UTF-8: byte 0xe9 at offset 11)"
    assert "not UTF-8: byte 0xff at offset 0" in _refused(loads_json, "{}".encode("utf-16"), "f.json", "x")


def test_malformed_json_names_line_and_column():
    assert _refused(loads_json, '{\n  "a": 1,\n}', "f.json", "the spec") == \
        "f.json:3: the spec is not JSON (Expecting property name enclosed in double quotes, column 1)"
    assert "Exceeds the limit" in _refused(loads_json, "9" * 5000, "f.json", "the spec")


def test_every_user_json_reader_goes_through_it(tmp_path):
    """The facts file, the launch spec, a box's saved facts, a runtime description, doctor's
    findings, an inventory and a model's config.json: each refuses a FIFO and a duplicate key in
    one line naming the file, through the same reader."""
    from escha_deploy.sglang.arch import read_model_dir
    from escha_deploy.facts.factsfile import load_facts_file
    from escha_deploy.facts.saved import load_findings
    from escha_deploy.fleet.plan import BOX_FACTS_HINT, BOX_FACTS_WHAT
    from escha_deploy.pipeline import FactsFileHost, gather
    from escha_deploy.profile import load_profile
    from escha_deploy.launch.serve import read_spec
    from escha_deploy.runtime.description import read_description
    from escha_deploy.runtime.inventory import read_inventory
    from escha_deploy.runtime.patching import recorded_series

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    dup = tmp_path / "dup.json"
    dup.write_text('{"schema_version": 1, "schema_version": 1}')
    prof = load_profile("rtx5060ti-tp2")

    def read_box_facts(p):  # a fleet box's facts, as fleet plan reads them
        return gather(prof, FactsFileHost(str(p), what=BOX_FACTS_WHAT, hint=BOX_FACTS_HINT))

    for reader in (load_facts_file, read_spec, read_box_facts, read_description, read_inventory, recorded_series):
        for p in (fifo, dup):
            msg = _within(5, _refused, reader, p)
            assert msg.startswith(f"{p}:") and ("not a regular file" in msg or "twice in one object" in msg), msg
    assert _within(5, load_findings, fifo) is None  # doctor's own cache: unreadable means none saved
    model = tmp_path / "m"
    model.mkdir()
    os.mkfifo(model / "config.json")
    assert _within(5, _refused, read_model_dir, model).startswith(f"{model / 'config.json'}: cannot read")
    (model / "config.json").unlink()
    (model / "config.json").write_text('{"model_type": "x", "model_type": "y"}')
    assert "'model_type' twice" in _refused(read_model_dir, model)


def test_file_problem_never_raises_and_never_blocks(tmp_path):
    from escha_deploy.utils.jsonio import file_problem, is_regular_file

    f = tmp_path / "f"
    f.write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert file_problem(f) is None and is_regular_file(f)
    assert file_problem(fifo) == "a FIFO (named pipe), not a regular file"
    assert file_problem("/dev/zero") == "a character device, not a regular file"
    assert file_problem(tmp_path) == "a folder, not a regular file"
    assert file_problem(tmp_path / "none") == "No such file or directory"
    assert file_problem(tmp_path / ("x" * 4096)) == "File name too long"  # Path.is_file raises here
    assert file_problem(f / "x") == "Not a directory"
    assert not is_regular_file(fifo)
