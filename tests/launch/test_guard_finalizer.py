"""A SIGINT or SIGTERM that arrives while a finalizer runs (a ``__del__``: an event loop's, a
socket's) is not lost: Python prints and drops an exception raised there, which left `up`
following the log with its one obeyed signal spent (tests/launch/test_up_signals.py hung so).
``guard``'s handler sends the signal again once the finalizer has returned. A callback the
handler cannot recognise from its frames (a ``weakref.ref`` callback: importlib frees each
import's module lock through one, ``_get_module_lock.<locals>.cb``, and a SIGTERM landing there
left `up` following the log in a CI run) drops the raised ``Signalled`` to
``sys.unraisablehook``; the scope's hook sends the signal again."""

from __future__ import annotations

import os
import signal
import sys
import time
import weakref

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


class _Referent:
    pass


def _signal_in_callback(_ref):
    os.kill(os.getpid(), signal.SIGTERM)  # delivered inside a weakref callback
    time.sleep(0.01)


def test_a_signal_dropped_in_a_weakref_callback_is_sent_again(capsys):
    seen = []
    hook_before = sys.unraisablehook
    sys.unraisablehook = seen.append  # what reaches the hook that was set before the scope
    try:
        t0 = time.monotonic()
        with pytest.raises(guard.Signalled) as e:
            with guard.signals_raise():
                obj = _Referent()
                ref = weakref.ref(obj, _signal_in_callback)
                del obj  # the callback runs now; Python drops what the handler raises there
                time.sleep(2)  # the re-sent signal raises here
        elapsed = time.monotonic() - t0
    finally:
        sys.unraisablehook = hook_before
    assert e.value.signum == signal.SIGTERM
    assert elapsed < 1.5, elapsed
    assert seen == []  # the dropped Signalled was taken by the scope, not printed
    assert ref() is None
    assert sys.unraisablehook is hook_before


def test_other_unraisable_exceptions_reach_the_previous_hook():
    seen = []
    hook_before = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with guard.signals_raise():
            class _Bad:
                def __del__(self):
                    raise ValueError("from a finalizer")
            obj = _Bad()
            del obj
    finally:
        sys.unraisablehook = hook_before
    assert [type(u.exc_value) for u in seen] == [ValueError]
