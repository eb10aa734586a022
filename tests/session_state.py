"""This test session's own state folders, set up when tests/conftest.py imports this module
(before any test or subprocess runs).

escha-deploy finds its state folders by XDG variables: ``paths.cache_dir`` (doctor's findings,
bench's last prefill, up's launch specs, the fleet router's files) by ``XDG_CACHE_HOME``, and
``launch.native.runtime_dir`` (native serve's port locks, state files and secrets) by
``XDG_RUNTIME_DIR``. The session points both at folders of its own, so the suite never writes
into the user's ~/.cache and two copies on one machine never share state; a test that sets its
own (``monkeypatch.setenv``, an ``env=`` of its own) still wins.
"""

from __future__ import annotations

import os

#: The variables set, in the order of ``SESSION_STATE``'s folders.
STATE_ENV = ("XDG_CACHE_HOME", "XDG_RUNTIME_DIR")


def _session_state_dirs() -> dict[str, str]:
    """Make this session's state folders (removed at exit) and set ``STATE_ENV`` to them. The
    runtime folder is made on /dev/shm when there is one (tmpfs, as ``XDG_RUNTIME_DIR`` is under
    systemd), so a secret a native serve writes there is still never on a disk."""
    import atexit
    import shutil
    import tempfile

    prefix = f"escha-test-{os.getpid()}-"
    cache = tempfile.mkdtemp(prefix=prefix + "cache-")
    run = tempfile.mkdtemp(prefix=prefix + "run-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    for d in (cache, run):
        atexit.register(shutil.rmtree, d, True)
    dirs = dict(zip(STATE_ENV, (cache, run)))
    os.environ.update(dirs)
    return dirs


#: Whether the folders were set before escha-deploy was imported (tests/conftest.py imports this
#: module first, so no test, fixture or subprocess can have seen the user's folders).
BEFORE_ESCHA_DEPLOY = "escha_deploy" not in __import__("sys").modules
#: ``{variable: folder}`` for this session.
SESSION_STATE = _session_state_dirs()
