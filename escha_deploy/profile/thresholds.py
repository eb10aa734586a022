"""The alert thresholds and their defaults, each with its source (nothing of escha-deploy is
imported here: the profile's ``watch`` section and ``watch.alerts`` both read it)."""

from pydantic import BaseModel, ConfigDict, Field

#: Finished requests the window must hold before a flat host tier counts as inert: with fewer,
#: no reuse may have reached an evicted prefix yet. Our choice, sized so that a canary run
#: (`escha-deploy canary`, a few dozen requests with known reuse) decides it.
INERT_MIN_REQUESTS = 20
#: Swap pages per second (in + out, /proc/vmstat pswpin + pswpout) above which the box is
#: swapping: 64 pages (256 KiB at 4 KiB pages) per second ignores the odd page the kernel
#: moves while idle, and catches the continuous swapping of an over-committed box.
SWAP_PAGES_PER_S = 64.0
#: Memory PSI ``some avg10`` (percent of wall time some task stalled on memory) to alert at:
#: a sixth of systemd-oomd's default kill limit (``DefaultMemoryPressureLimit=60%``,
#: oomd.conf(5)), so the alert comes well before anything is killed.
PSI_SOME_AVG10 = 10.0


class Thresholds(BaseModel):
    """The alerts' thresholds: the profile's ``watch`` section, else these defaults."""

    model_config = ConfigDict(frozen=True)
    inert_min_requests: int = Field(INERT_MIN_REQUESTS, ge=1)
    swap_pages_per_s: float = Field(SWAP_PAGES_PER_S, ge=0)
    psi_some_avg10: float = Field(PSI_SOME_AVG10, ge=0, le=100)
