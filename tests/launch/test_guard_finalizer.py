"""A SIGINT or SIGTERM that arrives while a finalizer runs (a ``__del__``: an event loop's, a
socket's) is not lost: Python prints and drops an exception raised there, which left `up`
following the log with its one obeyed signal spent (tests/launch/test_up_signals.py hung so).
``guard``'s handler sends the signal again once the finalizer has returned."""

from __future__ import annotations

import os
import signal
import time

import pytest

from escha_deploy.launch import guard


class _SignalledInDel:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # delivered here, inside __del__
        time.sleep(0.01)


def test_a_signal_during_a_finalizer_is_raised_after_it():
    with pytest.raises(guard.Signalled) as e:
        with guard.signals_raise():
            obj = _SignalledInDel()
            del obj  # the finalizer runs now; the handler must not raise inside it
            time.sleep(2)  # the re-sent signal raises here
    assert e.value.signum == signal.SIGINT


def test_a_signal_outside_a_finalizer_raises_at_once():
    t0 = time.monotonic()
    with pytest.raises(guard.Signalled):
        with guard.signals_raise():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)
    assert time.monotonic() - t0 < 1
