"""Regenerate escha_deploy/catalog/profile.schema.json from the Profile models.

The shipped profiles point editors at it (``# yaml-language-server: $schema=...``) and a test
fails when the committed file differs from the models. Run: ``python scripts/gen_profile_schema.py``.
"""

import json

from escha_deploy.utils.paths import catalog_dir
from escha_deploy.profile import profile_json_schema

if __name__ == "__main__":
    out = catalog_dir() / "profile.schema.json"
    out.write_text(json.dumps(profile_json_schema(), indent=2) + "\n")
    print(out)
