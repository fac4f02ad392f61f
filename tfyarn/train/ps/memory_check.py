"""``python -m tfyarn.train.ps.memory_check SPEC_JSON_FILE``: whether every ps can hold what ps mode places on it.
Run in a child process by preflight (:func:`tfyarn.gateway.preflight.check_ps_memory`) for a ps-mode job whose
tasks run this Python: the gateway itself never imports TensorFlow. Exit 2 with one line when the busiest ps's
variables and optimizer slots (a split table's shards counted where they go) plus TensorFlow's own memory exceed
``roles.ps.memory``: YARN would kill that ps mid-run, after the allocation, the upload and the start-up; or when
a weight is over what ps mode keeps in one piece (:func:`tfyarn.train.sharding.refuse_too_big`).

What a ps peaks at (measured with ``scripts/bench_ps_memory.py``, BENCHMARKS.md "Embedding tables in ps mode"):
TensorFlow and its server (:data:`RUNTIME_MIB`), its variables and slots, and one transient beside them: while it
initialises, the initial value of its biggest variable (the chief initialises one big variable of each ps at a
time); with checkpoints, a copy of every variable it holds: the Saver reads them all at once without copying
(:mod:`tfyarn.train.ps.saver`), but a sparse update that lands while a read is in flight copies that variable
(TF's copy-on-write), which async workers and the sync aggregator can do to each of them."""

from __future__ import annotations

import re
import sys

from tfyarn.spec import load_spec_json
from tfyarn.train import child_check, sharding
from tfyarn.tasklib.context import TaskContext
from tfyarn.tasklib.kv import MemoryKV
from tfyarn.train.model import is_custom_train, load_unbuilt
from tfyarn.train.ps.graph import build_graph
from tfyarn.train.ps.placement import _VAR_OPS, _op_bytes

#: What a ps process holds besides its variables (Python, TensorFlow, its gRPC server), MiB: 524 measured locally
#: without the fork server, ~620 on the YARN test cluster, 685 at a ps's peak in CI's YARN suite: a margin over them.
RUNTIME_MIB = 700

_MIB = 2**20
#: Below this, a ps's variables are not what decides its memory (TensorFlow's own RUNTIME_MIB is): a small model's
#: ps in a small container (512 MiB, where YARN does not enforce physical memory) is not refused for TF's footprint.
MATERIAL_MIB = 64


def ps_loads(spec_json: str) -> tuple[list[int], list[int], list[int]] | None:
    """(bytes of every variable on each ps, of the model's own variables on each ps, of the biggest variable on
    each ps), as the chief's graph places them; None when there is nothing tfyarn places (an entrypoint, a custom
    train function)."""
    spec = load_spec_json(spec_json)
    if spec.mode != "ps" or spec.entrypoint:
        return None
    model = load_unbuilt(spec.model, spec.params, spec.code or None, data=spec.data)
    if is_custom_train(model):
        return None
    n = spec.instances("ps")
    cluster = {"ps": [f"127.0.0.1:{i + 1}" for i in range(n)], "chief": ["127.0.0.1:0"]}
    workers = spec.instances("worker")
    if workers:
        cluster["worker"] = [f"127.0.0.1:{100 + i}" for i in range(workers)]
    ctx = TaskContext(spec=spec, role="chief", index=0, kv=MemoryKV(), cluster=cluster)
    tg = build_graph(ctx, model)
    own = {name.split("/part_")[0] for name in tg.model_var_keys}
    total, tables, biggest = [0] * n, [0] * n, [0] * n
    for op in tg.graph.get_operations():
        m = re.search(r"/job:ps/task:(\d+)", op.device)
        if op.type in _VAR_OPS and m:
            i = int(m.group(1))
            total[i] += _op_bytes(op)
            biggest[i] = max(biggest[i], _op_bytes(op))
            if re.sub(r"(/|_)part_\d+$", "", op.name) in own or op.name in own:
                tables[i] += _op_bytes(op)
    return total, tables, biggest


def problems(spec_json: str) -> list[str]:
    try:
        loads = ps_loads(spec_json)
    except sharding.TooBigForPs as exc:  # a weight no ps may hold in one piece (the graph's build says which)
        return exc.lines
    if loads is None:
        return []
    total, tables, biggest = loads
    spec = load_spec_json(spec_json)
    memory = spec.role("ps").memory_mib
    saves = bool(spec.checkpoint.dir)
    # the transient beside the variables: up to a copy of them all while a checkpoint is read, else the biggest
    # one's initial value (module docstring)
    transient = total if saves else biggest
    i = max(range(len(total)), key=lambda j: total[j] + transient[j])
    need = (total[i] + transient[i]) / _MIB + RUNTIME_MIB
    if need <= memory or (total[i] + transient[i]) / _MIB < MATERIAL_MIB:
        return []
    shards = spec.ps.max_shards or spec.instances("ps")
    peak = "a copy of them while a checkpoint is read" if saves else "its biggest variable's initial value"
    return [
        f"roles.ps.memory: ps:{i} would hold {total[i] / _MIB:,.0f} MiB of variables ({tables[i] / _MIB:,.0f} MiB "
        f"of model variables, the rest optimizer slots) + {transient[i] / _MIB:,.0f} MiB at its peak ({peak}) "
        f"+ ~{RUNTIME_MIB} MiB of TensorFlow = {need:,.0f} MiB, over its {memory:,} MiB (all ps: "
        f"{sum(total) / _MIB:,.0f} MiB of variables over {len(total)}, tables split in up to {shards}): give the ps "
        f"more memory, add ps, or raise ps.max_shards / lower ps.min_shard_size"
    ]


if __name__ == "__main__":
    sys.exit(child_check.run(problems))
