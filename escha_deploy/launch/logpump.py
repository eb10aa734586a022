"""Following a starting server container's log in a thread, for `up`'s ready wait
(``ready.wait_ready``: ``take`` gives its new lines, ``pause`` its pause between polls)."""

from __future__ import annotations

import queue
import threading


class LogPump:
    """Follows a container's log in a thread; ``take()`` returns lines seen since last call;
    ``pause(s)`` waits up to ``s`` seconds, less when the server logs that it listens."""

    def __init__(self, container) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        self.all: list[str] = []
        self._wake = threading.Event()
        self._container = container
        self._got = 0  # lines the followed streams delivered (a new stream repeats them first)
        self._t = self._start()

    def _start(self) -> threading.Thread:
        from . import docker as dk

        t = threading.Thread(target=self._run, args=(dk, self._container, self._got), daemon=True)
        t.start()
        return t

    def _run(self, dk, container, skip: int) -> None:
        from .ready import WAKE_PHASES, phase_of

        try:
            for n, line in enumerate(dk.log_lines(container, follow=True)):
                if n < skip:
                    continue
                self._got += 1
                self.q.put(line)
                if phase_of(line) in WAKE_PHASES:
                    self._wake.set()
        except Exception:  # noqa: BLE001 - the container went away; the waiter sees it
            pass
        self._wake.set()  # the log ended: the waiter should look now (exited, or gone)

    def refollow(self) -> None:
        """Follow again once the stream ended while the container still runs (the daemon's
        socket dropped and came back): the new stream's first lines, already seen, are skipped."""
        if not self._t.is_alive():
            self._t = self._start()

    def pause(self, seconds: float) -> None:
        """The ready wait's pause between polls (``ready.wait_ready``): ``seconds``, or until
        the server logs one of ``ready.WAKE_PHASES`` (or its log ends), whichever comes first."""
        if self._wake.wait(seconds):
            self._wake.clear()

    def following(self) -> bool:
        """True while the log stream is open: the daemon closes a followed log when the
        container stops, so this answers "still running?" without a round trip."""
        return self._t.is_alive()

    def take(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                break
        self.all.extend(out)
        return out
