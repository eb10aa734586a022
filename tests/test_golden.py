"""What each shipped profile renders (argv, env, compose files, Kubernetes manifests, the key
table) equals the golden files under tests/golden, written by scripts/gen_golden.py: a change
that alters what is rendered shows its diff in the commit that causes it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("gen_golden", ROOT / "scripts" / "gen_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_shipped_profile_renders_its_golden_files(tmp_path, capsys):
    gen = _script()
    rendered = gen.render(tmp_path)
    have = {str(p.relative_to(gen.GOLDEN)): p.read_text() for p in gen.GOLDEN.rglob("*") if p.is_file()}
    assert sorted(rendered) == sorted(have)
    for name, text in rendered.items():
        assert text == have[name], f"tests/golden/{name} differs: run python scripts/gen_golden.py and review the diff"


def test_the_check_names_a_file_that_differs(tmp_path, monkeypatch, capsys):
    gen = _script()
    golden = tmp_path / "golden"
    monkeypatch.setattr(gen, "GOLDEN", golden)
    assert gen.main([]) == 0
    victim = next(p for p in sorted(golden.rglob("serve.json")))
    victim.write_text(victim.read_text().replace("--tp-size", "--tp"))
    assert gen.main(["--check"]) == 1
    assert f"golden: tests/golden/{victim.relative_to(golden)}: differs" in capsys.readouterr().err
