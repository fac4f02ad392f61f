"""The runtime's KV on YARN: skein's application key-value store behind tfyarn's :class:`~tfyarn.tasklib.kv.KV`
(bounded waits naming the keys still missing, ``str`` values, :class:`~tfyarn.tasklib.kv.KVUnavailable` when the
application master is lost; skein's own ``kv.wait`` blocks forever).

Also the task index: skein names containers ``<service>_<n>`` and gives a *restarted* container a new ``n``, so each
container claims a free ``slot/<role>:<i>`` owned by it (:func:`claim_task_index`); skein deletes owned keys when
their container exits, so a replacement finds exactly the dead task's slot.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from contextlib import suppress
from typing import Any, Iterable, Mapping

from tfyarn.cluster._skein import skein
from tfyarn.contracts.in_app import in_attempt, parse_attempt
from tfyarn.contracts.kv_keys import ATTEMPT_KEY, SLOT_DONE_PREFIX, SLOT_PREFIX, TASKMAP_PREFIX
from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.kv import KV, KVUnavailable, wait_timeout

log = logging.getLogger(__name__)

# ``slot-done/<role>:<index>`` (SLOT_DONE_PREFIX) is not owned: skein deletes a container's owned keys (its ``slot/``)
# on *any* exit, success included, and a replacement container must not take the slot of a task that is done (in
# async ps mode a worker that finished its steps would be "replaced" and its share lost). ``taskmap/`` is not owned
# either, so it outlives the container (status and logs use it).


#: How often a put is tried when the application master fails it (:meth:`SkeinKV.put`).
PUT_TRIES = 3
#: A wait re-reads the keys it still misses this often, besides waking on their watch events.
WAIT_REREAD_S = 5.0
#: How long a wait gives skein to confirm its watch before it goes on without it (:meth:`SkeinKV._subscribed`).
SUBSCRIBE_S = 10.0


def slot_key(role: str, index: int) -> str:
    return f"{SLOT_PREFIX}{role}:{index}"


class SkeinKV(KV):
    """tfyarn KV over a ``skein.kv.KeyValueStore`` (``app.kv``). Thread-safe as skein's store is."""

    def __init__(self, store: Any, container_id: str | None = None):
        self.store = store
        #: ``<service>_<n>`` of this container (for owned keys); None on the gateway.
        self.container_id = container_id

    @classmethod
    def from_current(cls) -> "SkeinKV":
        """The KV of the application this container belongs to (``skein.ApplicationClient.from_current()``)."""

        sk = skein()
        try:
            app = sk.ApplicationClient.from_current()
        except ValueError as exc:  # skein raises context.ValueError "Not running inside a container"
            raise KVUnavailable(f"not inside a skein container ({exc}); a local run sets TFYARN_KV=http://…") from None
        return cls(app.kv, os.environ.get("SKEIN_CONTAINER_ID"))

    # skein raises ConnectionError when the application master is unreachable; map it to tfyarn's error.
    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConnectionError as exc:
            raise KVUnavailable(f"skein application master unreachable: {exc}") from None

    def get(self, key: str) -> str | None:
        v = self._call(self.store.get, key)
        return None if v is None else v.decode()

    def put(self, key: str, value: str) -> None:
        """Bounded retry: skein 0.8.2's application master fails a put whose watch notification races a watch being
        created on a range holding the key (two threads write the watcher's gRPC stream: IllegalStateException
        'sendHeaders has already been called', a bare ``ApplicationError`` here; seen failing a ps's rendezvous).
        The value is stored by then but that watcher's event is lost; a put is idempotent and notifies again."""

        for attempt in range(PUT_TRIES):
            try:
                self._call(self.store.put, key, value=str(value).encode())
                return
            except skein().exceptions.ApplicationError as exc:
                if attempt + 1 == PUT_TRIES:
                    raise
                log.warning(
                    "put %s failed in the application master (%s: %s); putting it again", key, type(exc).__name__, exc
                )
                time.sleep(0.2 * (attempt + 1))

    def delete(self, key: str) -> None:
        self._call(self.store.discard, key)

    def items(self, prefix: str = "") -> dict[str, str]:
        got = self._call(self.store.get_prefix, prefix) if prefix else self._call(self.store.get_range)
        return {k: v.decode() for k, v in got.items()}

    def wait_all(self, keys: Iterable[str], timeout: float, what: str | None = None) -> dict[str, str]:
        """Block until every key exists, woken by skein's watch events and re-reading the missing keys every
        :data:`WAIT_REREAD_S`; bounded by ``timeout``. Subscribing before the first read closes the race where a key
        appears between the read and the watch."""
        keys = list(dict.fromkeys(keys))
        deadline = time.monotonic() + timeout
        eq: Any = self._subscribed(keys, min(timeout, SUBSCRIBE_S), what)
        try:
            found = {k: v for k in keys if (v := self.get(k)) is not None}
            while len(found) < len(keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise wait_timeout(keys, found, timeout, what)
                ev, eq = self._next_event(eq, min(left, WAIT_REREAD_S), what)
                if ev is None:  # an event the application master failed to send (see put) is not waited for
                    found.update({k: v for k in keys if k not in found and (v := self.get(k)) is not None})
                elif ev.key in keys and ev.result is not None and ev.result.value is not None:
                    found[ev.key] = ev.result.value.decode()
            return {k: found[k] for k in keys}
        finally:
            with suppress(Exception):  # the AM may be gone; the wait's outcome matters, not the cleanup
                eq.unsubscribe_all()

    def _subscribed(self, keys: list[str], bound: float, what: str | None) -> Any:
        """An event queue watching PUTs of ``keys``. skein 0.8.2 waits for a subscription's answer without a bound,
        forever once its watch stream has died (the AM's HTTP/2 GOAWAY "sent too many headers", seen under load):
        past ``bound`` the wait goes on without it, on its re-reads."""
        eq = self._call(self.store.event_queue)
        failed: list[BaseException] = []

        def subscribe() -> None:
            try:
                for k in keys:
                    eq.subscribe(key=k, event_type="PUT")
            except Exception as exc:  # noqa: BLE001 - handed to the waiting thread
                failed.append(exc)

        t = threading.Thread(target=subscribe, name="tfyarn-kv-subscribe", daemon=True)
        t.start()
        t.join(bound)
        if failed and isinstance(failed[0], ConnectionError):
            raise KVUnavailable(f"skein application master unreachable: {failed[0]}")
        if t.is_alive() or failed:
            why = failed[0] if failed else f"no answer within {bound:g}s"
            log.warning("skein's watch for %s failed (%s); re-reading every %gs", what or "keys", why, WAIT_REREAD_S)
        return eq

    def _next_event(self, eq: Any, wait_s: float, what: str | None) -> tuple[Any, Any]:
        """The next watch event within ``wait_s`` (None: none came) and the queue to read next (None once skein's
        watch stream has died: the wait sleeps between its re-reads)."""
        if eq is None:
            time.sleep(wait_s)
            return None, None
        try:
            return eq.get(timeout=wait_s), eq
        except queue.Empty:
            return None, eq
        except ConnectionError as exc:
            raise KVUnavailable(
                f"skein application master unreachable while waiting for {what or 'keys'}: {exc}"
            ) from None
        except skein().exceptions.ApplicationError as exc:
            log.warning("skein's watch for %s died (%s); re-reading every %gs", what or "keys", exc, WAIT_REREAD_S)
            return None, None

    def claim(self, key: str, value: str, owner: str | None = None, also: Mapping[str, str] | None = None) -> bool:
        """Atomically create ``key`` if absent; with ``owner`` (a container id) skein deletes it when that exits.
        ``also``: keys put in the same transaction (only if the claim succeeds)."""

        skv = skein().kv
        op = skv.put(key, value=str(value).encode(), owner=owner) if owner else skv.put(key, value=str(value).encode())
        ops = [op, *(skv.put(k, value=str(v).encode()) for k, v in (also or {}).items())]
        res = self._call(self.store.transaction, conditions=[skv.missing(key)], on_success=ops)
        return bool(res.succeeded)


# ------------------------------------------------------------------------------------------------------ task index


def parse_container_id(container_id: str) -> tuple[str, int]:
    """``'worker_3'`` → ``('worker', 3)`` (skein's ``SKEIN_CONTAINER_ID`` = ``<service>_<instance>``)."""
    service, sep, n = container_id.rpartition("_")
    if not sep or not service or not n.isdigit():
        raise ValueError(f"not a skein container id: {container_id!r} (expected '<service>_<n>')")
    return service, int(n)


class NoTaskLeft(Exception):
    """Every task of the role is held by a live container or has finished: this container replaces one that was
    killed after its task had finished (``slot-done/``), so there is nothing for it to do (it exits 0)."""


def claim_task_index(kv: SkeinKV, role: str, instances: int, container_id: str, timeout: float = 60.0) -> int:
    """This container's task index: its own instance number if that slot is free, else the first free slot (a
    replacement ``worker_2`` of a dead ``worker_0`` takes the slot skein freed when ``worker_0`` exited: skein drops a
    dead container's owned keys before it requests the replacement). Every slot held or done, one done:
    :class:`NoTaskLeft` (it replaces a task killed after it had finished). Otherwise bounded by ``timeout``.
    """
    _, n = parse_container_id(container_id)
    order = ([n] if n < instances else []) + [i for i in range(instances) if i != n]
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        done = kv.items(f"{SLOT_DONE_PREFIX}{role}:")
        for i in order:
            if f"{SLOT_DONE_PREFIX}{role}:{i}" in done:
                continue
            # the task map in the same transaction: every container that ever held the slot is counted by
            # restarts_before, even one that died right after its claim
            if kv.claim(
                slot_key(role, i),
                container_id,
                owner=container_id,
                also={f"{TASKMAP_PREFIX}{container_id}": f"{role}:{i}"},
            ):
                return i
        held = kv.items(f"{SLOT_PREFIX}{role}:")
        finished = sorted(k[len(SLOT_DONE_PREFIX) :] for k in done)
        if finished and all(
            slot_key(role, i) in held or f"{SLOT_DONE_PREFIX}{role}:{i}" in done for i in range(instances)
        ):
            raise NoTaskLeft(
                f"container {container_id}: every {role} task is running or finished "
                f"(finished: {', '.join(finished)}); it replaces one killed after it had finished"
            )
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"timed out after {timeout:g}s waiting for a free {role} slot for container "
                f"{container_id}: all {instances} held ({', '.join(f'{k}={v}' for k, v in held.items())})"
                + (f" or finished ({', '.join(finished)})" if finished else "")
            )
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def restarts_before(kv: KV, task: str, container_id: str) -> int:
    """How many containers held ``task`` (``role:index``) before ``container_id`` in this job attempt: its restart
    number on YARN.

    The local launcher counts a task's restarts and passes ``TFYARN_RESTART``; skein only starts a new container, so
    the count comes from the task map (one entry per container that claimed a slot; never deleted), of the
    containers of the attempt running in the app (``control/attempt``, contracts.in_app): a container the in-app
    supervisor started for a new attempt is no restart."""

    attempt = parse_attempt(kv.get(ATTEMPT_KEY))
    return sum(
        1
        for k, v in kv.items(TASKMAP_PREFIX).items()
        if v == task and k[len(TASKMAP_PREFIX) :] != container_id and in_attempt(k[len(TASKMAP_PREFIX) :], attempt)
    )


def mark_slot_done(kv: KV, task: str) -> None:
    """``task`` (``role:index``) finished its role: no replacement container may claim its slot afterwards."""
    kv.put(f"{SLOT_DONE_PREFIX}{task}", "1")
