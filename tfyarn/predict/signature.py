"""A SavedModel's signature read without TensorFlow, and checked against the spec's features.

Why: a model whose inputs do not match ``predict.features`` must fail before any container starts, and the gateway
has no TensorFlow. ``saved_model.pb`` is a protobuf; this module declares the few messages on the path to a
signature's inputs (SavedModel → MetaGraphDef.signature_def → SignatureDef.inputs → TensorInfo: dtype, shape) with
protobuf's own descriptors (field numbers from TF's ``saved_model.proto``, ``meta_graph.proto``,
``tensor_shape.proto``) and lets protobuf parse the file: every other field of the file is skipped as unknown.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

#: tensorflow/core/framework/types.proto: DataType numbers → the spec's dtype names (bytes and string are both
#: DT_STRING: either feature dtype matches a string input)
DTYPES = {1: "float32", 2: "float64", 3: "int32", 7: "string", 9: "int64", 10: "bool", 19: "float16"}


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # a spec dtype name, or "DT_<n>" for one tfyarn has no name for
    shape: tuple[int | None, ...] | None  # None: unknown rank; None in it: a free dimension (-1)


@functools.lru_cache(maxsize=1)
def _saved_model_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="tfyarn_saved_model_subset.proto", package="tfyarn_sm", syntax="proto3"
    )

    def message(name: str, fields: list[tuple[str, int, int, int, str]], parent: Any = None) -> Any:
        m = (parent.nested_type if parent is not None else fdp.message_type).add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
        return m

    def map_entry(name: str, value_type: str, parent: Any) -> None:  # a map<string, value_type> field's entry
        fields = [("key", 1, F.TYPE_STRING, opt, ""), ("value", 2, F.TYPE_MESSAGE, opt, value_type)]
        message(name, fields, parent).options.map_entry = True

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("Dim", [("size", 1, F.TYPE_INT64, opt, ""), ("name", 2, F.TYPE_STRING, opt, "")])
    message(
        "TensorShape", [("dim", 2, F.TYPE_MESSAGE, rep, ".tfyarn_sm.Dim"), ("unknown_rank", 3, F.TYPE_BOOL, opt, "")]
    )
    message(
        "TensorInfo",
        [
            ("name", 1, F.TYPE_STRING, opt, ""),
            ("dtype", 2, F.TYPE_INT32, opt, ""),  # an enum on the wire is a varint: int32 reads it
            ("tensor_shape", 3, F.TYPE_MESSAGE, opt, ".tfyarn_sm.TensorShape"),
        ],
    )
    sig = message(
        "SignatureDef",
        [
            ("inputs", 1, F.TYPE_MESSAGE, rep, ".tfyarn_sm.SignatureDef.InputsEntry"),
            ("outputs", 2, F.TYPE_MESSAGE, rep, ".tfyarn_sm.SignatureDef.OutputsEntry"),
            ("method_name", 3, F.TYPE_STRING, opt, ""),
        ],
    )
    for entry in ("InputsEntry", "OutputsEntry"):
        map_entry(entry, ".tfyarn_sm.TensorInfo", sig)
    meta = message("MetaGraph", [("signature_def", 5, F.TYPE_MESSAGE, rep, ".tfyarn_sm.MetaGraph.SignatureDefEntry")])
    map_entry("SignatureDefEntry", ".tfyarn_sm.SignatureDef", meta)
    message(
        "SavedModel",
        [("schema_version", 1, F.TYPE_INT64, opt, ""), ("meta_graphs", 2, F.TYPE_MESSAGE, rep, ".tfyarn_sm.MetaGraph")],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tfyarn_sm.SavedModel"))


def _info(t: Any) -> TensorInfo:
    shape = (
        None if t.tensor_shape.unknown_rank else tuple(None if d.size < 0 else int(d.size) for d in t.tensor_shape.dim)
    )
    return TensorInfo(DTYPES.get(t.dtype, f"DT_{t.dtype}"), shape)


def parse_signatures(pb: bytes) -> dict[str, tuple[dict[str, TensorInfo], dict[str, TensorInfo]]]:
    """``saved_model.pb``'s bytes → ``{signature: (inputs, outputs)}`` of its first meta graph (the one
    ``tf.saved_model.save`` writes)."""
    sm = _saved_model_class()()
    sm.ParseFromString(pb)
    if not sm.meta_graphs:
        raise ValueError("saved_model.pb holds no meta graph")
    return {
        name: ({k: _info(v) for k, v in s.inputs.items()}, {k: _info(v) for k, v in s.outputs.items()})
        for name, s in sm.meta_graphs[0].signature_def.items()
    }


def read_signature(model_url: str, name: str) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    """The inputs and outputs of signature ``name`` of the SavedModel at ``model_url`` (any fsspec URL)."""
    import fsspec

    with fsspec.open(f"{model_url.rstrip('/')}/saved_model.pb", "rb") as f:
        sigs = parse_signatures(f.read())
    if name not in sigs:
        raise ValueError(f"{model_url}: no signature {name!r} (it has: {', '.join(sorted(sigs)) or 'none'})")
    return sigs[name]


def mismatches(features: Mapping[str, Any], inputs: Mapping[str, TensorInfo]) -> list[str]:
    """Each way the signature's ``inputs`` and the spec's ``features`` disagree, one line each naming both sides: an
    input no feature provides, a dtype or a shape that differs (a free dimension matches any size)."""
    out = []
    for name, t in sorted(inputs.items()):
        f = features.get(name)
        if f is None:
            out.append(
                f"the model's input {name!r} ({t.dtype}) is not among predict.features "
                f"({', '.join(sorted(features)) or 'none'})"
            )
            continue
        want = {"bytes": "string"}.get(f.dtype, f.dtype)
        if t.dtype != want:
            out.append(f"the model's input {name!r} is {t.dtype}, predict.features.{name} is {f.dtype}")
            continue
        if getattr(f, "varlen", False) and getattr(f, "pad_to", None) is None:
            out.append(f"predict.features.{name}: variable-length features without pad_to are not scored yet")
            continue
        dims = (f.pad_to,) if getattr(f, "varlen", False) else tuple(f.shape)
        if t.shape is not None and (
            len(t.shape) != len(dims) + 1 or any(a is not None and a != b for a, b in zip(t.shape[1:], dims))
        ):
            shown = ["batch", *("?" if d is None else d for d in t.shape[1:])]
            out.append(f"the model's input {name!r} has shape {shown}, predict.features.{name} shape {list(dims)}")
    return out


def resolve_latest(url: str, get_fs: Any = None) -> str:
    """``<dir>/latest`` → ``<dir>/<the newest numbered version>`` (TF Serving's layout, as tfyarn exports); any
    other URL as it is. ``get_fs``: url → (fsspec filesystem, path) (the gateway's login)."""
    if url.rstrip("/").rsplit("/", 1)[-1] != "latest":
        return url
    import fsspec

    root = url.rstrip("/").rsplit("/", 1)[0]
    fs, path = (get_fs or fsspec.core.url_to_fs)(root)
    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)] if fs.exists(path) else []
    versions = sorted(int(n) for n in names if n.isdigit())
    if not versions:
        raise FileNotFoundError(f"{url}: no numbered SavedModel version under {root}")
    return f"{root}/{versions[-1]}"
