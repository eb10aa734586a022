"""The pre-flight's constructor check reads SGLang's statements by their source
(``sglang_preflight._constructor_code``): its segments are ``ast.get_source_segment``'s, from lines
split once per file instead of once per statement."""

from __future__ import annotations

import ast
from pathlib import Path

from escha_deploy.launch import sglang_preflight as pf

#: Line ends ast splits at (\r\n, \r, \n) and characters it does not split at (form feed,
#: U+2028), multi-byte text before a statement on its line (columns are UTF-8 byte offsets),
#: statements over several lines, and a last line without its end.
ODD = ('x = 1\r\ny = "é"; z = (1,\r  2)\n\x0cclass A:\n    def __init__(self):\n        self.s = "\u2028"\n'
       '        if self.s >= "a":\n            raise ValueError(\n                "no")\nw = 3')


def segments(source: str, every: int = 1) -> tuple[list, list]:
    nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.stmt, ast.expr))][::every]
    lines = pf._source_lines(source)  # noqa: SLF001
    return [ast.get_source_segment(source, n) for n in nodes], [pf._source_segment(lines, n) for n in nodes]  # noqa: SLF001


def test_segments_are_ast_get_source_segments():
    ast_says, ours = segments(ODD)
    assert ours == ast_says and len(ours) > 20
    # and over a real file of this size (the pre-flight itself, 1,000+ lines; one node in 200:
    # ast's own function splits the whole file for each)
    ast_says, ours = segments(Path(pf.__file__).read_text(encoding="utf-8"), every=200)
    assert ours == ast_says
