"""Job spec: YAML → validated, immutable model.

Why pydantic with ``extra="forbid"`` everywhere: a typo in a key (``epoch:`` for ``epochs:``) must be an error, not a
silently ignored setting that a user discovers after an hour on the cluster. All problems are collected and reported
at once, each with its YAML path, so a user fixes a spec in one round trip (:class:`SpecError`).

This module imports no TensorFlow: validating and submitting happen on gateway nodes.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import shlex
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tfyarn.errors import SpecError

# ---------------------------------------------------------------------------------------------------------------- units

# The patterns are ECMAScript-compatible (no inline flags): the JSON Schema hands them to editors as they are.
_SIZE_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*([KkMmGgTt][Ii]?[Bb]?)?\s*$"
_SIZE_RE = re.compile(_SIZE_PATTERN)
#: MiB per unit (lower-cased): 1024-based with or without "i" ("2g", "2 GiB"); KB/MB/GB/TB decimal.
_SIZE_UNITS_MIB = {"": 1, "mb": 1e6 / 2**20, "gb": 1e9 / 2**20, "tb": 1e12 / 2**20, "kb": 1e3 / 2**20} | {
    p + tail: 1024.0**e for p, e in (("k", -1), ("m", 0), ("g", 1), ("t", 2)) for tail in ("", "i", "ib")
}
_DURATION_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|m|min|mins|h|hr|hrs|d)?\s*$"
_DURATION_RE = re.compile(_DURATION_PATTERN)
_DURATION_S = {"": 1, "ms": 1e-3, "d": 86400} | {
    unit: scale
    for scale, units in ((1, "s sec secs"), (60, "m min mins"), (3600, "h hr hrs"))
    for unit in units.split()
}


def _quantity(value: Any, what: str, regex: re.Pattern[str], units: dict[str, float], examples: str) -> float:
    """A positive number as it is, or a string: a number with one of ``units`` (matched by ``regex``), scaled."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a {what}")
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        m = regex.match(str(value))
        if not m:
            raise ValueError(f"{value!r} is not a {what} (examples: {examples})")
        n = float(m.group(1)) * units[(m.group(2) or "").lower()]
    if n <= 0:
        raise ValueError(f"{value!r} must be positive")
    return n


def parse_memory_mib(value: Any) -> int:
    """'2 GiB', '2g', '512 MiB', 2048 (MiB) → MiB, rounded up (YARN allocates whole MiB)."""
    return int(-(-_quantity(value, "size", _SIZE_RE, _SIZE_UNITS_MIB, "'2 GiB', '512 MiB', 2048") // 1))


def parse_size_bytes(value: Any) -> int:
    """'64 MiB', '1 KiB', 64 (MiB) → bytes."""
    return int(_quantity(value, "size", _SIZE_RE, _SIZE_UNITS_MIB, "'64 MiB', '1 GiB', 64") * 2**20)


def parse_duration_s(value: Any) -> float:
    """'30s', '5m', '1h', 90 (seconds) → seconds."""
    return _quantity(value, "duration", _DURATION_RE, _DURATION_S, "'30s', '5m', '1h', 90")


# What a spec may say for a size or a duration: a positive number or a string with a unit. Used as the JSON Schema of
# the fields below (the parsers run before pydantic's own check, so without it the schema would show only the parsed
# type, and editors would flag '2 GiB' or '5m' as errors).
_PositiveNumber = Annotated[float, Field(gt=0)]
_SizeInput = Union[_PositiveNumber, Annotated[str, StringConstraints(pattern=_SIZE_PATTERN)]]
_DurationInput = Union[_PositiveNumber, Annotated[str, StringConstraints(pattern=_DURATION_PATTERN)]]

#: MiB; a spec gives '2 GiB', '512 MiB' or MiB as a number.
MemoryMiB = Annotated[int, BeforeValidator(parse_memory_mib, json_schema_input_type=_SizeInput)]
#: Bytes; a spec gives '64 MiB', '1 KiB' or MiB as a number.
SizeBytes = Annotated[
    int,
    BeforeValidator(parse_size_bytes, json_schema_input_type=_SizeInput),
    PlainSerializer(lambda b: f"{b / 1024!r} KiB", return_type=str),  # (a bare number would read back as MiB)
]
#: Seconds; a spec gives '30s', '5m', '1h' or seconds as a number.
Duration = Annotated[float, BeforeValidator(parse_duration_s, json_schema_input_type=_DurationInput)]


def _listify(v: Any) -> Any:
    """One URL or glob needs no list around it."""
    return [v] if isinstance(v, str) else v


def _nonempty(v: list[str]) -> list[str]:
    if not v:
        raise ValueError("at least one URL or glob is needed")
    return v


#: fsspec URLs or globs; a spec gives one without a list around it.
Urls = Annotated[list[str], BeforeValidator(_listify, json_schema_input_type=Union[str, list[str]])]
#: At least one of them.
SomeUrls = Annotated[Urls, AfterValidator(_nonempty)]


# Integer and boolean fields use pydantic's strict types: in lax mode ``epochs: true`` would be 1 epoch, ``sync: 1``
# or ``sync: "no"`` a boolean and ``batch_size: 32.0`` an int. YAML (files, ``--set`` values) and JSON already give
# real ints and booleans, so strictness rejects only mistakes, and the JSON Schema says exactly what is accepted.


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# ------------------------------------------------------------------------------------------------------------- sections


class PackMode(str, Enum):
    auto = "auto"
    conda = "conda"
    venv = "venv"
    none = "none"


class Environment(_Model):
    """Where the Python that runs each container comes from (exactly one source wins: archive > python > pack)."""

    pack: PackMode = PackMode.auto
    archive: str | None = Field(None, description="Prebuilt packed env (tar.gz) URL, e.g. hdfs:///envs/tf.tar.gz")
    python: str | None = Field(
        None, description="A python already installed on every node, e.g. /opt/py311/bin/python (local runs use it too)"
    )

    @model_validator(mode="after")
    def _one_source(self) -> "Environment":
        if self.archive and self.python:
            raise ValueError("give either 'archive' or 'python', not both")
        return self

    @property
    def source(self) -> str:
        if self.archive:
            return "archive"
        if self.python:
            return "python"
        return "none" if self.pack == PackMode.none else "pack"


DType = Literal["float32", "float64", "int64", "int32", "string", "bytes"]


class Feature(_Model):
    """One feature: fixed-length (``shape: [k, ...]``), or variable-length (``shape: [null]``: a tf.SparseTensor
    [B, max length in the batch] as TF's VarLenFeature gives, or with ``pad_to: N`` a dense [B, N] tensor)."""

    dtype: DType
    shape: tuple[Union[StrictInt, None], ...] = ()
    pad_to: StrictInt | None = Field(
        None,
        gt=0,
        description="variable-length only: a dense [B, pad_to] tensor, "
        "longer lists truncated, shorter padded with default",
    )
    default: Union[StrictBool, StrictInt, float, str, None] = Field(
        None,
        description="fills a fixed feature a record lacks (without it that is an error); the padding value "
        "of pad_to (default 0 / empty string)",
    )

    @field_validator("shape")
    @classmethod
    def _positive(cls, v: tuple[int | None, ...]) -> tuple[int | None, ...]:
        if None in v and v != (None,):
            raise ValueError(f"a variable-length feature has shape [null] (one dimension), got {list(v)}")
        if any(d is not None and d <= 0 for d in v):
            raise ValueError(f"dimensions must be positive, got {list(v)}")
        return v

    @model_validator(mode="after")
    def _pad_to_varlen(self) -> "Feature":
        if self.pad_to is not None and not self.varlen:
            raise ValueError(
                f"pad_to is for variable-length features (shape: [null]); this one has shape {list(self.shape)}"
            )
        if self.default is not None:
            text = self.dtype in ("string", "bytes")
            if text != isinstance(self.default, str) or isinstance(self.default, bool):
                raise ValueError(f"default {self.default!r} does not fit dtype {self.dtype}")
            if self.dtype in ("int64", "int32") and not isinstance(self.default, int):
                raise ValueError(f"default {self.default!r} is not an integer (dtype {self.dtype})")
        return self

    @property
    def varlen(self) -> bool:
        return self.shape == (None,)

    @property
    def size(self) -> int:
        """Values per record (a variable-length feature: ``pad_to``, else 0 = unknown)."""
        if self.varlen:
            return self.pad_to or 0
        return math.prod(d for d in self.shape if d is not None)  # (fixed: no None, see _positive)


class Data(_Model):
    train: SomeUrls = Field(..., description="fsspec URLs or globs of TFRecord files (hdfs://, file://, s3://, ...)")
    eval: Urls = Field(default_factory=list)
    features: dict[str, Feature]
    label: str | None = Field(None, description="name of the label feature (default: 'label' if present)")
    batch_size: StrictInt = Field(..., gt=0, description="per worker; global batch = batch_size x training workers")
    epochs: StrictInt = Field(1, gt=0)
    shuffle_seed: StrictInt = 0
    shuffle_buffer: StrictInt = Field(0, ge=0, description="records; seeded shuffle inside a worker's share, 0 = off")
    prefetch: StrictInt = Field(
        4,
        gt=0,
        description="ready batches buffered per worker beyond one parse group "
        "(~16k records): memory = (prefetch + group) x batch",
    )
    compression: Literal["auto", "none", "gzip"] = "auto"
    format: Literal["auto", "tfrecord", "parquet", "orc"] = Field(
        "auto", description="auto: by file extension (.parquet/.pq, .orc, anything else TFRecord)"
    )
    on_corrupt: Literal["fail", "skip"] = "fail"
    index_cache: str | None = Field(
        None,
        description="where file indexes are cached when the data's directory is "
        "not writable, on a filesystem every task sees (default: "
        "<staging dir>/index on YARN, this machine's cache locally)",
    )

    @model_validator(mode="after")
    def _label(self) -> "Data":
        if not self.features:
            raise ValueError("features: at least one feature is needed")
        label = self.label if self.label is not None else ("label" if "label" in self.features else None)
        if label is not None and label not in self.features:
            raise ValueError(f"label: {label!r} is not one of the features ({', '.join(self.features)})")
        object.__setattr__(self, "label", label)
        return self


class Checkpoint(_Model):
    dir: str | None = Field(None, description="fsspec URL; checkpoints are written locally then uploaded atomically")
    every_steps: StrictInt | None = Field(None, gt=0)
    every_secs: Duration | None = Field(600.0, description="duration, e.g. '10m'")
    keep: StrictInt = Field(3, gt=0)
    init_from: str | None = Field(
        None,
        description="warm start: another job's checkpoint dir (fsspec URL); when dir has no checkpoint yet, "
        "the model's variables start from init_from's latest one (global step 0, fresh optimizer)",
    )


class Export(_Model):
    """A SavedModel of the final checkpoint at the end of a successful run (TF Serving layout: ``<dir>/<step>/``)."""

    dir: str = Field(
        ...,
        description="fsspec URL; each export is a numbered version dir (the global step), "
        "written under a temporary name then renamed",
    )
    keep: StrictInt = Field(3, gt=0, description="newest versions kept under dir")


class Ps(_Model):
    """ps mode: how big variables (embedding tables) are split by rows over the ps (docs/training.md)."""

    min_shard_size: SizeBytes = Field(
        64,  # MiB (parsed like a spec's value: validate_default)
        description="a variable of this size or more is split by rows over the ps, each shard on its own ps "
        "(lookups gather on the shards' ps); '64 MiB', '1 KiB' or MiB as a number",
    )
    max_shards: StrictInt | None = Field(
        None,
        gt=0,
        description="shards per variable at most (default: the number of ps); 1 keeps every variable whole up to 1 GiB",
    )


class Predict(_Model):
    """Batch scoring (``tfyarn predict SPEC``, docs/predict.md): a trained model over a whole table, by workers only,
    in equal row ranges, each output part written under a temporary name and renamed once complete."""

    saved_model: str | None = Field(
        None,
        description="an exported SavedModel dir (hdfs:///models/ctr/1234), or <export dir>/latest: the newest "
        "numbered version, fixed when the job is submitted",
    )
    checkpoint: str | None = Field(
        None,
        description="a checkpoint dir instead of saved_model: the spec's model: and params: build the model, "
        "restored from the dir's latest checkpoint",
    )
    signature: str = Field("serving_default", description="the SavedModel's signature to call")
    input: SomeUrls = Field(..., description="fsspec URLs, globs or table roots, as data.train")
    format: Literal["auto", "tfrecord", "parquet", "orc"] = Field(
        "auto", description="input format; auto: by extension (.parquet, .orc; anything else is TFRecord)"
    )
    compression: Literal["auto", "none", "gzip"] = "auto"
    features: dict[str, Feature] | None = Field(
        None, description="the model's inputs as read from the input; default: data.features without the label"
    )
    output: str = Field(..., description="output dir (fsspec URL); refused when it exists unless --overwrite")
    output_format: Literal["parquet", "tfrecord"] = "parquet"
    keep: Union[Literal["all"], list[str]] = Field(
        default_factory=list,
        description="input columns written beside the predictions: a list, or all (every column of a table; "
        "every feature of TFRecords)",
    )
    batch_size: StrictInt = Field(1024, gt=0, description="rows per model call (the last batch padded)")
    part_rows: StrictInt = Field(
        1_000_000, gt=0, description="rows per output part at most: the unit a retried task rewrites"
    )
    prefetch: StrictInt = Field(4, gt=0, description="batches read ahead of the model")
    on_corrupt: Literal["fail", "skip"] = Field(
        "fail", description="a corrupt record or a null without default: fail, or skip (counted and listed)"
    )
    index_cache: str | None = Field(None, description="where input indexes are cached (as data.index_cache)")

    @model_validator(mode="after")
    def _one_model(self) -> "Predict":
        if (self.saved_model is None) == (self.checkpoint is None):
            raise ValueError("give exactly one of saved_model and checkpoint")
        return self


class Tracking(_Model):
    """Experiment tracking (optional extra ``tracking``: mlflow-skinny in the tasks' environment): the chief logs the
    job as an MLflow run (params, per-step loss and examples/s, eval metrics, the summary and the run report)."""

    mlflow: str = Field(..., description="MLflow tracking URI: http://host:5000, file:///dir, databricks, ...")
    experiment: str | None = Field(None, description="experiment name (created when missing; default: the job's name)")


#: What ``data`` holds when an entrypoint job has none (never validated: an empty ``train`` means "no data").
_NO_DATA = Data.model_construct(train=[], features={}, batch_size=1)


RoleName = Literal["chief", "worker", "ps", "evaluator", "tensorboard"]
ROLE_ORDER: tuple[RoleName, ...] = ("chief", "worker", "ps", "evaluator", "tensorboard")
#: Roles that appear in TF_CONFIG's cluster; evaluator and tensorboard stand outside it.
CLUSTER_ROLES: tuple[str, ...] = ("chief", "worker", "ps")
#: Roles whose failure (after their restarts) does not fail the job, on either backend: a dead TensorBoard must not
#: kill a day of training (YARN: skein's ``allow_failures``; local: the launcher goes on and says so).
SIDECAR_ROLES: frozenset[str] = frozenset({"tensorboard"})


class Role(_Model):
    instances: StrictInt = Field(1, ge=0)
    memory_mib: MemoryMiB = Field(2048, alias="memory", description="'2 GiB', '512 MiB' or MiB as a number")
    vcores: StrictInt = Field(1, gt=0)
    gpus: StrictInt = Field(0, ge=0)
    node_label: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    max_restarts: StrictInt = Field(0, ge=0, description="times one task of this role is restarted in place")
    restart: Literal["never", "on_failure", "exit_code"] = Field(
        "on_failure",
        description="which failures restart a task (up to max_restarts): any non-zero exit, or "
        "exit_code: only 128-255 (killed by a signal, OOM), as Kubeflow's TFJob",
    )
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("env", mode="before", json_schema_input_type=dict[str, Union[str, int, float, bool]])
    @classmethod
    def _env_str(cls, v: Any) -> Any:
        """Environment values are strings; ``OMP_NUM_THREADS: 4`` in YAML is an int, meant as "4"."""
        if isinstance(v, dict):
            return {str(k): str(val) for k, val in v.items()}
        return v


class Timeouts(_Model):
    """Every wait in tfyarn is bounded by one of these (seconds; strings like '2m' accepted)."""

    rendezvous: Duration = 300.0
    stall: Duration = 600.0
    shutdown: Duration = 60.0
    step: Duration = 300.0
    active_deadline: Duration | None = Field(None, description="the whole job (all attempts); none by default")
    allocation: Duration = Field(600.0, description="YARN: containers must be allocated within this")
    node_lost: Duration = Field(
        15.0,
        description="YARN: a task silent this long while its node's NodeManager does "
        "not answer is lost with its node (YARN's own expiry: 10 min)",
    )
    rerequest: Duration = Field(
        30.0,
        description="YARN: a task's container REQUESTED this long while the ResourceManager holds "
        "no request for it (skein lost it) is requested again, at most 3 times per task",
    )


class Retry(_Model):
    """Job-level attempts: on a failure no task restart can fix (a ps or the chief died, a
    collective broke), every task is stopped and the job starts again from the latest checkpoint,
    up to ``max_attempts`` in all. A failure of the job's own code (an exception, a NaN loss, bad
    input) is not retried: it would fail the same way again."""

    max_attempts: StrictInt = Field(1, ge=1)
    backoff: Duration = Field(10.0, description="wait before the next attempt")
    cluster_faults: StrictInt = Field(
        10,
        ge=0,
        description="the cluster's faults allowed besides max_restarts and max_attempts (a preemption, a lost node, "
        "a peer's or the transport's error: contracts.triage): in-place restarts per task of a role that can "
        "rejoin (async ps workers), and job attempts",
    )


class Kerberos(_Model):
    """The gateway's Kerberos login (tfyarn.cluster.kerberos); the keytab stays on the gateway: tasks use delegation
    tokens."""

    principal: str
    keytab: str

    def __repr__(self) -> str:  # a keytab is a password: its path stays out of logs and tracebacks too
        return f"Kerberos(principal={self.principal!r}, keytab=<hidden>)"

    __str__ = __repr__


class Acls(_Model):
    enable: StrictBool = False
    view_users: list[str] = Field(default_factory=list)
    view_groups: list[str] = Field(default_factory=list)
    modify_users: list[str] = Field(default_factory=list)
    modify_groups: list[str] = Field(default_factory=list)
    ui_users: list[str] = Field(default_factory=list)


# ------------------------------------------------------------------------------------------------------------- job spec

_MODEL_REF_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _one_worker() -> dict[RoleName, Role]:
    return {"worker": Role(instances=1)}


class JobSpec(_Model):
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    queue: str = "default"
    tags: list[str] = Field(default_factory=list)
    user: str | None = Field(None, description="proxy user on YARN")
    environment: Environment = Field(default_factory=Environment)
    code: str | None = Field(None, description="directory shipped with the job and put on sys.path")
    entrypoint: str | None = Field(
        None,
        description="your own training program instead of model: 'train.py --flag x' (a script in code:, "
        "with its arguments) or 'module:function'; runs on every chief and worker with TF_CONFIG "
        "set (docs/models.md)",
    )
    job: Literal["train", "predict"] = Field(
        "train",
        description="what the job does: train, or predict (score predict.input with the model; "
        "tfyarn predict SPEC sets it)",
    )
    predict: Predict | None = Field(None, description="batch scoring with a trained model (docs/predict.md)")
    model: str = Field(
        "",
        description="module:callable returning a tfyarn model, a compiled Keras model, or a "
        "custom train(ctx); required unless entrypoint is given (or a predict job scores a saved_model)",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments passed to the model callable")
    mode: Literal["ps", "allreduce"] = "ps"
    sync: StrictBool = False
    ps: Ps = Field(default_factory=Ps, description="ps mode: splitting big variables over the ps")
    data: Data = Field(
        default_factory=lambda: _NO_DATA,
        validate_default=False,
        description="required with model:, optional with entrypoint:",
    )
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    export: Export | None = Field(None, description="export the final model as a SavedModel (needs checkpoint.dir)")
    roles: dict[RoleName, Role] = Field(default_factory=lambda: _one_worker())
    timeouts: Timeouts = Field(default_factory=Timeouts)
    retry: Retry = Field(default_factory=Retry)
    success_policy: Literal["all_workers", "chief"] = Field(
        "all_workers", description="the job succeeds when every training task finished, or as soon as the chief did"
    )
    fail_on_nan_loss: StrictBool = Field(
        True,
        description="a NaN or infinite loss ends the task (and the job) at that step, before it checkpoints: "
        "training diverged, and every later step and checkpoint would be wasted",
    )
    kerberos: Kerberos | None = None
    acls: Acls = Field(default_factory=Acls)
    tracking: Tracking | None = Field(None, description="log the job as an MLflow run (tracking: {mlflow: URI})")
    #: Where the spec was loaded from (relative local paths in it resolve against this directory).
    base_dir: str | None = Field(None, exclude=True)

    @field_validator("model")
    @classmethod
    def _model_ref(cls, v: str, info: ValidationInfo) -> str:
        predict = info.data.get("predict")
        scores_saved_model = info.data.get("job") == "predict" and predict is not None and predict.saved_model
        if not v and not info.data.get("entrypoint") and not scores_saved_model:
            if predict is not None and predict.saved_model:
                raise ValueError("required to train (to score predict.saved_model: job: predict, or tfyarn predict)")
            raise ValueError("required")  # checked here, so it is listed with every other problem
        if v and not _MODEL_REF_RE.match(v):
            raise ValueError(f"{v!r} is not 'module:callable' (e.g. tfyarn.models.recommender:model)")
        return v

    @property
    def has_data(self) -> bool:
        """Whether the spec has ``data:`` (an entrypoint job may have none)."""
        return bool(self.data.train)

    def entrypoint_parts(self) -> tuple[str, list[str]]:
        """``entrypoint`` → (a script path or 'module:function', its arguments), split as a shell would."""

        parts = shlex.split(self.entrypoint or "")
        return (parts[0], parts[1:]) if parts else ("", [])

    @model_validator(mode="after")
    def _entrypoint(self) -> "JobSpec":
        """Exactly one of ``model`` and ``entrypoint``; ``data`` is required with ``model`` only."""
        problems = []
        if self.entrypoint is not None:
            target, _ = self.entrypoint_parts()
            if self.model:
                problems.append("entrypoint: give either model or entrypoint, not both")
            if not target:
                problems.append("entrypoint: empty (e.g. 'train.py --epochs 3' or 'mypkg.train:main')")
            elif not target.endswith(".py") and not _MODEL_REF_RE.match(target):
                problems.append(f"entrypoint: {target!r} is neither a script ('train.py ...') nor 'module:function'")
            if self.export is not None:
                problems.append("export: an entrypoint job saves its own model (tfyarn cannot know what it trained)")
        elif self.job == "predict":
            problems += self._predict_problems()
        elif "data" not in self.model_fields_set:
            problems.append("data: required")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _predict_problems(self) -> list[str]:
        """A predict job: its section, the model's inputs named, and workers to score with."""
        p = self.predict
        if p is None:
            return ["predict: required by job: predict (the model, input and output to score)"]
        problems = []
        if not p.features and not ("data" in self.model_fields_set and self.data.features):
            problems.append("predict.features: required (the model's inputs), or data.features")
        if p.checkpoint and not self.model:
            problems.append("model: predict.checkpoint needs the model: that wrote it (and its params:)")
        if self.instances("worker") < 1:
            problems.append("roles.worker.instances: a predict job scores with workers, at least 1")
        keep = p.keep if isinstance(p.keep, list) else []
        if len(set(keep)) < len(keep):
            problems.append("predict.keep: a column is named twice")
        return problems

    @property
    def scoring_features(self) -> dict[str, Feature]:
        """A predict job's model inputs: ``predict.features``, else ``data.features`` without the label."""
        if self.predict is not None and self.predict.features:
            return dict(self.predict.features)
        return {k: v for k, v in self.data.features.items() if k != self.data.label}

    @model_validator(mode="after")
    def _topology(self) -> "JobSpec":
        if self.job == "predict":  # workers only: the training roles and their rules do not apply
            return self
        n = self.instances
        problems = [f"roles.{r}.instances: at most 1 {r}" for r in ("chief", "evaluator", "tensorboard") if n(r) > 1]
        if n("chief") + n("worker") == 0:
            problems.append("roles: at least one chief or worker is needed to train")
        if self.mode == "ps" and n("ps") == 0:
            problems.append("roles.ps.instances: mode 'ps' needs at least one ps")
        if self.mode == "allreduce" and n("ps") > 0:
            problems.append("roles.ps: mode 'allreduce' has no parameter servers (remove roles.ps)")
        if n("evaluator") and not self.data.eval:
            problems.append("data.eval: an evaluator needs eval data")
        if (n("evaluator") or n("tensorboard")) and not self.checkpoint.dir:
            problems.append("checkpoint.dir: evaluator and tensorboard follow the checkpoint dir, set one")
        c = self.checkpoint
        if c.init_from and c.dir and c.init_from.rstrip("/") == c.dir.rstrip("/"):
            problems.append(
                "checkpoint.init_from: is checkpoint.dir itself (a job resumes from its own dir anyway); "
                "name another job's checkpoint dir"
            )
        if self.export and not self.checkpoint.dir:
            problems.append("export.dir: the model is exported from the final checkpoint: set checkpoint.dir too")
        for role in ("ps", "chief"):
            r = self.roles.get(role)
            if r and r.max_restarts:
                problems.append(
                    f"roles.{role}.max_restarts: a restarted {role} cannot rejoin a running job "
                    f"(the ps holds the variables, the chief the session); use retry.max_attempts"
                )
        w = self.roles.get("worker")
        if self.mode == "allreduce" and w and w.max_restarts:
            problems.append(
                "roles.worker.max_restarts: allreduce cannot replace one worker in a running "
                "collective; use retry.max_attempts"
            )
        if self.mode == "ps" and self.sync and w and w.max_restarts:
            problems.append(
                "roles.worker.max_restarts: sync ps mode cannot rejoin a restarted worker into a lockstep "
                "round safely (its dead process may have pushed gradients for a round still open); "
                "use retry.max_attempts"
            )
        if problems:
            raise ValueError("\n".join(problems))  # one line per problem, split again in _problems
        return self

    # -- derived facts used by every backend and the runtime ---------------------------------------------------------
    def role(self, name: str) -> Role:
        """The :class:`Role` ``name``, looked up by a plain string (the role part of a task id;
        ``roles`` is keyed by :data:`RoleName`). KeyError when the spec has none, as
        ``roles[name]``."""
        for key in ROLE_ORDER:
            if key == name:
                return self.roles[key]
        raise KeyError(name)

    def instances(self, role: str) -> int:
        return self.role(role).instances if role in self.roles else 0

    @property
    def training_tasks(self) -> list[str]:
        """Tasks that read data and run steps, in data-rank order: chief first, then workers."""
        return ["chief:0"] * self.instances("chief") + [f"worker:{i}" for i in range(self.instances("worker"))]

    @property
    def num_training_workers(self) -> int:
        return len(self.training_tasks)

    @property
    def global_batch_size(self) -> int:
        return self.data.batch_size * self.num_training_workers

    def tasks(self) -> list[str]:
        """Every task of the job as 'role:index', in launch order (ps first: workers connect to them)."""
        order = ("ps", "chief", "worker", "evaluator", "tensorboard")
        return [f"{r}:{i}" for r in order for i in range(self.instances(r))]

    def to_json(self) -> str:
        doc = self.model_dump(mode="json", by_alias=True, exclude=None if self.has_data else {"data"})
        return json.dumps(doc | {"base_dir": self.base_dir}, indent=1)


# ------------------------------------------------------------------------------------------------------------- loading


def _format_loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and p.startswith(("function-", "literal[")))]
    return ".".join(parts) or "(top level)"


def _lookup(doc: Any, loc: tuple[Any, ...]) -> tuple[bool, Any]:
    cur = doc
    for p in loc:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and isinstance(p, int) and p < len(cur):
            cur = cur[p]
        else:
            return False, None
    return True, cur


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys a spec accepts at ``loc`` (a mapping's location in the document): for "did you mean". A mapping with
    fixed keys (``roles``) accepts their names."""
    tp: Any = JobSpec
    parts = list(loc)
    while True:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if not parts:
                return [f.alias or name for name, f in tp.model_fields.items() if not f.exclude]
            field = tp.model_fields.get(parts[0]) or next(
                (f for f in tp.model_fields.values() if f.alias == parts[0]), None
            )
            if field is None:
                return []
            tp, parts = field.annotation, parts[1:]
            continue
        args = [a for a in get_args(tp) if a is not type(None)]
        origin = get_origin(tp)
        if origin is dict and args and not parts and get_origin(args[0]) is Literal:
            return [str(a) for a in get_args(args[0])]
        if origin in (dict, list) and parts:
            tp, parts = args[-1], parts[1:]  # a mapping's key or a list's index
        elif args and origin not in (dict, list, Literal):
            tp = args[0]  # X | None
        else:
            return []


def _unknown_key(loc: tuple[Any, ...]) -> str:

    known = _keys_at(loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key (typo? known here: {', '.join(known)})" if known else "unknown key (typo?)"


def _problems(exc: ValidationError, doc: Any) -> list[str]:
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = _format_loc(loc)
        if path.endswith("memory_mib"):
            path = path[: -len("memory_mib")] + "memory"
        etype, msg = err["type"], err["msg"]
        if etype == "extra_forbidden":
            out.append(f"{path}: {_unknown_key(loc)}")
            continue
        if etype == "literal_error" and loc[-1] == "[key]" and _keys_at(loc[:-2]):
            # a mistyped key of a mapping whose keys are fixed names (roles.wrker): worded as any other unknown key
            out.append(f"{_format_loc(loc[:-1])}: {_unknown_key(loc[:-1])}")
            continue
        if etype == "missing":
            out.append(f"{path}: required")
            continue
        msg = msg.removeprefix("Value error, ")
        found, value = _lookup(doc, loc)
        if etype == "value_error" and (
            msg.endswith("is not a size (examples: '2 GiB', '512 MiB', 2048)")
            or "is not a duration" in msg
            or "must be positive" in msg
        ):
            out.append(f"{path}: {msg}")
        elif etype == "value_error" and path == "(top level)":
            out.extend(m.strip() for m in msg.split("\n"))
        elif found and not isinstance(value, (dict, list)):
            out.append(f"{path}: {value!r} {msg[0].lower() + msg[1:]}")
        else:
            out.append(f"{path}: {msg}")
    return out


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a key given twice in one mapping is an error (YAML keeps the last value
    silently: ``epochs: 3`` … ``epochs: 5`` trains 5). Every duplicate is reported at once, with its path and lines;
    a key next to a merge key (``<<: *base``) overrides the merged one, as YAML intends."""

    #: Path of the document's root: a ``--set`` value sits at its key's path.
    root: tuple[Any, ...] = ()

    def construct_document(self, node: yaml.Node) -> Any:
        problems = list(self._duplicates(node, self.root, set()))
        if problems:
            raise SpecError(problems)
        return super().construct_document(node)

    def _duplicates(self, node: yaml.Node, path: tuple[Any, ...], seen: set[int]) -> Iterator[str]:
        if id(node) in seen:  # an alias: its node was checked where it was anchored
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                yield from self._duplicates(item, (*path, i), seen)
        elif isinstance(node, yaml.MappingNode):
            where: dict[Any, list[yaml.Node]] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    where.setdefault(self.construct_object(key_node), []).append(key_node)
            for key, nodes in where.items():
                if len(nodes) > 1:
                    yield f"{_format_loc((*path, key))}: duplicate key ({_positions(nodes)})"
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                yield from self._duplicates(value_node, (*path, key), seen)


def _positions(nodes: list[yaml.Node]) -> str:
    """'lines 12 and 14', or 'line:column 1:2 and 1:8' when keys share a line (a flow mapping, a --set value)."""
    lines = [n.start_mark.line + 1 for n in nodes]
    if len(set(lines)) == len(lines):
        label, items = "lines", [str(line) for line in lines]
    else:
        label, items = "line:column", [f"{n.start_mark.line + 1}:{n.start_mark.column + 1}" for n in nodes]
    return f"{label} {', '.join(items[:-1])} and {items[-1]}"


def _load_yaml(text: str, root: tuple[Any, ...] = ()) -> Any:
    """YAML → Python, as ``yaml.safe_load`` but duplicate keys raise :class:`SpecError` (paths under ``root``)."""
    loader = _SpecLoader(text)
    loader.root = root
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _apply_override(doc: dict, assignment: str) -> None:
    """``--set roles.worker.instances=4``: the value is parsed as YAML (so 4 is an int, [a, b] a list). An override
    that cannot be applied raises :class:`SpecError`, listed beside the spec's other problems by the caller."""
    if "=" not in assignment:
        raise SpecError([f"--set {assignment!r}: expected key.path=value"])
    key, raw = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise SpecError([f"--set {assignment!r}: empty key"])
    cur = doc
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise SpecError([f"--set {key}: {p!r} is not a mapping"])
        cur = nxt
    try:
        cur[parts[-1]] = _load_yaml(raw, root=tuple(parts)) if raw.strip() else None
    except SpecError as exc:
        raise SpecError([f"--set {p}" for p in exc.problems]) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"--set {key.strip()}: not valid YAML: {exc}"]) from None


def load_spec_dict(doc: Any, overrides: tuple[str, ...] | list[str] = (), base_dir: str | None = None) -> JobSpec:
    if not isinstance(doc, dict):
        raise SpecError([f"(top level): expected a mapping of keys, got {type(doc).__name__}"])
    problems: list[str] = []
    for o in overrides:
        try:
            _apply_override(doc, o)
        except SpecError as exc:
            problems += exc.problems  # reported with the spec's own problems, every one at once
    try:
        spec = JobSpec.model_validate(doc)
    except ValidationError as exc:
        problems += _problems(exc, doc)
    if problems:
        raise SpecError(problems)
    return _resolve_paths(spec, base_dir or os.getcwd())


def _resolve_paths(spec: JobSpec, base_dir: str) -> JobSpec:
    """Every local path of the spec made absolute once, at load: relative to the spec file (``base_dir``; a spec
    given as a dict: the caller's cwd), so every module and every task (whatever its working directory) reads the
    same absolute paths and none resolves them again."""

    def res(path: str) -> str:
        return path if "://" in path or Path(path).is_absolute() else str((Path(base_dir) / path).resolve())

    data = spec.data.model_copy(
        update={"train": [res(u) for u in spec.data.train], "eval": [res(u) for u in spec.data.eval]}
        | ({"index_cache": res(spec.data.index_cache)} if spec.data.index_cache else {})
    )
    ck = {k: res(v) for k in ("dir", "init_from") if (v := getattr(spec.checkpoint, k))}
    extra: dict[str, Any] = {}
    if spec.predict:
        p = spec.predict
        extra["predict"] = p.model_copy(
            update={"input": [res(u) for u in p.input], "output": res(p.output)}
            | {k: res(v) for k in ("saved_model", "checkpoint", "index_cache") if (v := getattr(p, k))}
        )
    if spec.job == "predict":  # workers only (a training spec's ps, chief, evaluator are not started)
        extra["roles"] = {"worker": spec.roles.get("worker") or Role()}
        extra["export"] = None
    update: dict[str, Any] = {"base_dir": base_dir, "data": data, "checkpoint": spec.checkpoint.model_copy(update=ck)}
    if spec.export:
        update["export"] = spec.export.model_copy(update={"dir": res(spec.export.dir)})
    if spec.code:
        update["code"] = res(spec.code)
    if spec.kerberos:
        update["kerberos"] = spec.kerberos.model_copy(update={"keytab": res(spec.kerberos.keytab)})
    return spec.model_copy(update=update | extra)


def load_spec(path: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> JobSpec:
    """Load, override and validate a YAML spec. Raises :class:`SpecError` listing every problem found."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError([f"{path}: cannot read ({exc.strerror})"]) from None
    try:
        doc = _load_yaml(text)
    except yaml.YAMLError as exc:
        raise SpecError([f"{path}: not valid YAML: {exc}"]) from None
    return load_spec_dict(doc if doc is not None else {}, overrides, base_dir=str(p.resolve().parent))


def load_spec_json(text: str) -> JobSpec:
    """The resolved spec as the launcher hands it to each task (already validated once on the gateway)."""
    doc = json.loads(text)
    base = doc.pop("base_dir", None)
    return load_spec_dict(doc, base_dir=base)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of what a spec file may say (for editors): the validation-mode schema describes the inputs the
    loader accepts (sizes and durations with units, one URL or a list), not the parsed model it produces."""
    return JobSpec.model_json_schema(by_alias=True, mode="validation")
