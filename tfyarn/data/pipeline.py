"""Batches across epochs with no gap at the boundaries (the next epoch is read while this one is consumed)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait
from typing import Any, Callable

from tfyarn.data.feeder import skip_report
from tfyarn.errors import WaitTimeout


class EpochPipeline:
    """Two feeders over the same manifest alternating epochs: the next epoch's run is opened once the current one
    has delivered its first batch, so its prefetch queue is full when it is needed.

    Why: a :class:`Feeder`'s first batch of an epoch is a cold start (threads, file open, first parse: 10–70 ms, many
    steps of a small model) at the point where every worker waits. Memory: at most two epochs' prefetch queues.
    """

    def __init__(self, make: Callable[[], Any], epochs: int):
        self.feeders = [make(), make()]
        self.epochs = epochs

    def steps(self, epoch: int) -> int:
        return int(self.feeders[0].steps(epoch))

    def run(self, epoch0: int, in_epoch0: int):
        """Yield ``(epoch, batch)`` from (epoch0, in_epoch0) to the end of the last epoch."""
        if epoch0 >= self.epochs:
            return
        cur = self.feeders[epoch0 % 2].epoch(epoch0, start_step=in_epoch0)
        for epoch in range(epoch0, self.epochs):
            opener = None
            for i, batch in enumerate(cur):
                yield epoch, batch
                if i == 0 and epoch == epoch0:
                    # The next feeder's framing process too, now (this feeder's started with its first batch): left
                    # to its own first batch, its start (Popen, ~1 ms of Python) fell on an epoch boundary.
                    start = getattr(self.feeders[(epoch0 + 1) % 2], "start_framer_soon", None)
                    if start is not None:
                        start()
                if i == 0 and epoch + 1 < self.epochs:
                    opener = self._open_async(epoch + 1)
            if epoch + 1 < self.epochs:
                cur = self._opened(opener, epoch + 1)

    def _open_async(self, epoch: int) -> Future:
        """Open ``epoch`` (plan + thread start: a few ms of Python) off the training thread, between steps."""
        opened: Future = Future()

        def open_() -> None:
            try:
                opened.set_result(self.feeders[epoch % 2].epoch(epoch))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the training thread by _opened
                opened.set_exception(exc)

        threading.Thread(target=open_, name=f"tfyarn-open-epoch-{epoch}", daemon=True).start()
        return opened

    def _opened(self, opener: Future | None, epoch: int) -> Any:
        if opener is None:  # the epoch had no batch (nothing to overlap with): open it now
            return self.feeders[epoch % 2].epoch(epoch)
        if not wait([opener], timeout=60.0).done:
            raise WaitTimeout(f"timed out after 60s waiting for the feeder to open epoch {epoch}")
        return opener.result()

    def skip_report(self) -> dict[str, Any]:
        """Both feeders' :meth:`Feeder.skip_report` as one (they share the manifest)."""
        return skip_report(self.feeders, getattr(self.feeders[0], "manifest", None))

    def close(self) -> None:
        for f in self.feeders:
            f.close()

    def __enter__(self) -> "EpochPipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
