"""The release catalog is read by libyaml's safe loader where PyYAML has it: the same values as
PyYAML's own safe loader, for every shipped catalog file a plan reads."""

from __future__ import annotations

import pytest
import yaml

from escha_deploy.sglang import releases


@pytest.mark.parametrize("path", [releases.releases_dir() / releases.INDEX,
                                  *sorted(releases.releases_dir().glob(f"*/{releases.FACTS}"))],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_catalog_reads_the_same_by_either_loader(path):
    assert releases._load_yaml(path) == yaml.safe_load(path.read_text(encoding="utf-8"))
