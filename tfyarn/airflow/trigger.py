"""``TfyarnTrigger``: the deferrable wait of :class:`tfyarn.airflow.operator.TfyarnOperator`.

Runs in the triggerer's event loop, so every tfyarn call (file reads locally, HTTP to the ResourceManager on YARN)
goes through ``asyncio.to_thread`` and never blocks other triggers. Fires one event: ``{"status": "done", ...}``
when the app reaches a terminal state, ``"timeout"`` when ``timeout`` runs out, ``"error"`` when the app cannot be read.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from tfyarn import api
from tfyarn.airflow._compat import BaseTrigger, TriggerEvent
from tfyarn.airflow.progress_log import progress_logger
from tfyarn.contracts.status import WaitClock
from tfyarn.runner.follow import Follower, supervisor_for


class TfyarnTrigger(BaseTrigger):
    def __init__(
        self, app_id: str, poll_interval: float = 5.0, log_interval: float = 30.0, timeout: float | None = None
    ):
        super().__init__()
        self.app_id, self.poll_interval, self.log_interval, self.timeout = app_id, poll_interval, log_interval, timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """This class and its ``__init__``'s arguments, as the triggerer rebuilds it."""
        names = ("app_id", "poll_interval", "log_interval", "timeout")
        return "tfyarn.airflow.trigger.TfyarnTrigger", {k: getattr(self, k) for k in names}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Follow the app as ``tfyarn wait`` does (:class:`tfyarn.runner.follow.Follower`: on YARN the job's deadline,
        allocation timeout and stall watch are enforced from here too), with this trigger's own ``timeout``
        (``WaitClock``)."""

        show = progress_logger(self.log, self.log_interval)
        clock = WaitClock(self.timeout, f"tfyarn app {self.app_id}")
        try:
            backend = await asyncio.to_thread(api.backend_for_app, self.app_id)
        except Exception as exc:  # noqa: BLE001 - reported to the task, which fails with it
            yield self._error(exc)
            return
        try:
            sup = await asyncio.to_thread(supervisor_for, backend, self.app_id)
            step = Follower(backend, self.app_id, sup).step
            while True:
                try:
                    st = await asyncio.to_thread(step)
                except Exception as exc:  # noqa: BLE001 - reported to the task, which fails with it
                    yield self._error(exc)
                    return
                show(st)
                if st.state.is_terminal:
                    yield TriggerEvent({"status": "done", "app_id": self.app_id, "state": st.state.value})
                    return
                expired = clock.expired(st.state)
                if expired:
                    yield TriggerEvent({"status": "timeout", "app_id": self.app_id, "message": expired})
                    return
                await asyncio.sleep(self.poll_interval)
        finally:
            await asyncio.to_thread(backend.close)

    def _error(self, exc: Exception) -> TriggerEvent:
        message = f"cannot read the status of tfyarn app {self.app_id}: {exc}"
        return TriggerEvent({"status": "error", "app_id": self.app_id, "message": message})

    async def on_kill(self) -> None:
        """A user killed the deferred task (mark failed / clear): kill the app too (Airflow 3.3+ calls this)."""

        self.log.warning("killing tfyarn app %s: the deferred Airflow task was killed", self.app_id)
        await asyncio.to_thread(api.kill, self.app_id)
