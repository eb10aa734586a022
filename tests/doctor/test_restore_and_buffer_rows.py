"""doctor's restore-bandwidth and per-buffer pinned rows, from recorded probe answers (pure), and
the bandwidth's way into the findings that ``plan`` reads."""

from escha_deploy.doctor.checks import check_pinned_buffers, check_restore
from escha_deploy.doctor.facts import ProbeFacts
from escha_deploy.doctor.probes import PinnedCeiling
from escha_deploy.doctor.run import probe_findings
from escha_deploy.facts.saved import DoctorFindings, RestoreBandwidth

MiB, GiB = 2**20, 2**30


def _ladder(buffers):
    return PinnedCeiling(allocator="pinned", target_bytes=4 * GiB, step_bytes=256 * MiB, largest_bytes=4 * GiB,
                         reached=False, extra={"buffers": buffers})


def test_each_buffer_reads_pinned_x_for_a_request_of_y():
    [row] = check_pinned_buffers(_ladder([{"request": 2_580_529_152, "pinned": 2_600_000_000}]), "ran now")
    assert row.status == "ok"
    assert "pinned 2.60 GB for a request of 2.58 GB" in row.detail


def test_a_power_of_two_reading_warns():
    # torch's caching allocator: 2,147,745,792 B pinned 4 GiB on an H200 machine
    [row] = check_pinned_buffers(_ladder([{"request": 2_147_745_792, "pinned": 4 * GiB}]), "ran now")
    assert row.status == "warn" and "pins more than the plan counts" in row.fix


def test_no_buffers_no_row():
    assert check_pinned_buffers(_ladder([]), "ran now") == []


def test_restore_row_and_finding():
    bw = RestoreBandwidth(method="pinned copy_", bytes=GiB, load_gbps=50.5, backup_gbps=52.0,
                          page_bytes=4 * MiB, page_load_gbps=17.0, page_backup_gbps=15.0)
    p = ProbeFacts(source="ran now", restore=bw)
    [row] = check_restore(p)
    assert row.status == "ok" and "load (host -> device) 50.5 GB/s" in row.detail and "pinned copy_" in row.detail
    f = probe_findings(p, host_id="h", platform="linux", created_at="2026-12-01T10:00:00+00:00")
    back = DoctorFindings.model_validate_json(f.model_dump_json())
    assert back.restore_bandwidth == bw


def test_restore_not_measured_says_why():
    [row] = check_restore(ProbeFacts(source="ran now", restore_error="no CUDA device visible to torch"))
    assert row.status == "warn" and "not measured" in row.detail
    assert check_restore(ProbeFacts(source="ran now")) == []
