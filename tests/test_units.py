import pytest

from escha_deploy.utils.units import GB, GiB, fmt_gb, parse_size


@pytest.mark.parametrize("text,expected", [
    ("12GiB", 12 * GiB), ("12GB", 12 * GB), ("32 GB", 32 * GB), ("0.5GiB", GiB // 2),
    ("512MiB", 512 * 2**20), ("0B", 0), ("1.31GiB", round(1.31 * GiB)), ("2tb", 2 * 10**12),
])
def test_parse_size_reads_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad,needle", [
    (12, "bare number"), (12.5, "bare number"), ("12", "bare number"), ("12Gi", "unknown unit 'Gi'"),
    ("GiB", "not a size"), (True, "size with a unit"), (None, "expected a size"),
])
def test_parse_size_refuses_ambiguous_input(bad, needle):
    with pytest.raises(ValueError, match=needle):
        parse_size(bad)


def test_fmt_gb_uses_decimal_gigabytes():
    assert fmt_gb(10_241_212_416) == "10.24 GB"


def test_parse_hicache_gb_one_parser_for_profile_and_cli():
    from escha_deploy.cli.plan import parse_hicache_size
    from escha_deploy.utils.units import parse_hicache_gb

    assert [parse_hicache_gb(v) for v in (7, "7", "7GB", " 7 gb ", 0)] == [7, 7, 7, 7, 0]
    assert parse_hicache_size("30GB") == 30
    with pytest.raises(ValueError, match="greater than 0"):
        parse_hicache_size("0")
    for bad in ("7GiB", "7.5", True, 7.0, "x"):
        with pytest.raises(ValueError, match="whole number of GB"):
            parse_hicache_gb(bad)
    with pytest.raises(ValueError, match="less than or equal to 1000000"):
        parse_hicache_gb(10**6 + 1)
