"""Regenerate escha_deploy/catalog/facts.schema.json from the facts-file models
(``escha_deploy/facts/file.py``).

A test fails when the committed file differs from the models. Run:
``python scripts/gen_facts_schema.py``.
"""

import json

from escha_deploy.facts.file import facts_json_schema
from escha_deploy.utils.paths import catalog_dir

if __name__ == "__main__":
    out = catalog_dir() / "facts.schema.json"
    out.write_text(json.dumps(facts_json_schema(), indent=2) + "\n")
    print(out)
