"""Model checkpoints as data: the lock file `model pull` writes beside the weights (``lock``),
and `model pull` / `model verify` on ``huggingface_hub`` (``pull``)."""

from __future__ import annotations

import os
from pathlib import Path

#: The lock file's name, in the model folder (``lock``).
LOCK_NAME = "escha-model.lock.json"


def pin_state(folder: str | Path | None) -> str:
    """What `plan` says of the weights' pin: ``pinned REPO@COMMIT (lock file)`` or
    ``unpinned`` (no folder here, or no lock file: `model pull` pins it); an unreadable lock
    file reads as unpinned, with its reason. Here, not in ``lock``, so a plan with no model
    folder (a described host) does not import the lock file's models."""
    from escha_deploy.utils.errors import BadInput

    if folder is None or not os.path.isdir(folder):
        return "unpinned (no model folder here; `escha-deploy model pull PROFILE` pins one)"
    from .lock import lock_path, read_lock

    try:
        lock = read_lock(folder)
    except BadInput as exc:
        return f"unpinned ({exc.problems[0]})"
    if lock is None:
        return f"unpinned (no {LOCK_NAME} in {folder}; `escha-deploy model pull PROFILE` pins it)"
    return f"pinned {lock.pin()} ({lock_path(folder)})"
