"""Which tfyarn app belongs to which Airflow task instance — the tags that make retries safe.

A retried task's earlier app keeps running (on YARN it is independent of the worker; locally its launcher is
detached): the operator tags every app with its dag id, task id (+ map index) and run id, so a retry finds that app
instead of starting a duplicate job writing to the same checkpoints. Tags are normalised as YARN stores them: lower
case, at most 100 characters (a long one cut and suffixed with a hash of the whole, keeping it unique).
"""

from __future__ import annotations

import hashlib
from typing import Iterable

MAX_TAG = 100


def normalise_tag(tag: str) -> str:
    """YARN-safe form of a tag: lower case, no commas, at most 100 characters (unique hash suffix if cut)."""
    t = tag.lower().replace(",", "_")
    if len(t) <= MAX_TAG:
        return t
    digest = hashlib.sha1(t.encode()).hexdigest()[:12]
    return f"{t[: MAX_TAG - 13]}~{digest}"


def airflow_tags(dag_id: str, task_id: str, run_id: str, map_index: int | None = None) -> list[str]:
    """The tags identifying one task instance (all its tries share them)."""
    task = task_id if map_index is None or map_index < 0 else f"{task_id}[{map_index}]"
    return [normalise_tag(f"airflow-{k}={v}") for k, v in (("dag", dag_id), ("task", task), ("run", run_id))]


def matches(app_tags: Iterable[str], wanted: Iterable[str]) -> bool:
    """True if an app carries every wanted tag (compared in normalised form: YARN lower-cases tags)."""
    have = {normalise_tag(t) for t in app_tags}
    return all(normalise_tag(w) in have for w in wanted)


def merge_tags(spec_tags: Iterable[str], extra: Iterable[str]) -> list[str]:
    """The spec's own tags followed by ``extra``, without duplicates, order kept."""
    return list(dict.fromkeys([*spec_tags, *extra]))
