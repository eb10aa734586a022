"""The pre-flight's deadline (``sglang_preflight.timeout_from_env``): ``ESCHA_SGLANG_PREFLIGHT_TIMEOUT``
is read with the one strict number reading (``units.parse_number``) and bounded; a bad value is
one exit-2 line naming the variable, before anything starts."""

from __future__ import annotations

import pytest

from escha_deploy.utils.errors import BadInput, ExitCode
from escha_deploy.launch.sglang_preflight import TIMEOUT_ENV, TIMEOUT_S, timeout_from_env


@pytest.mark.parametrize("raw,want", [(None, TIMEOUT_S), ("", TIMEOUT_S), ("600", 600.0), (" 90.5 ", 90.5),
                                      ("3600", 3600.0)])
def test_the_deadline_is_the_variable_or_the_default(raw, want):
    env = {} if raw is None else {TIMEOUT_ENV: raw}
    assert timeout_from_env(env) == want


@pytest.mark.parametrize("raw", ["0", "-5", "3601", "1_5", "0x10", "inf", "nan", "ten", "1e999"])
def test_a_deadline_that_is_not_seconds_is_one_bad_input_line(raw):
    with pytest.raises(BadInput) as e:
        timeout_from_env({TIMEOUT_ENV: raw})
    assert e.value.exit_code == ExitCode.BAD_INPUT
    assert str(e.value).startswith(f"{TIMEOUT_ENV}: ") and "\n" not in str(e.value), str(e.value)
