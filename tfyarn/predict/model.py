"""The model a scoring task calls: a SavedModel's signature as a TF function of one fixed batch shape.

* **Where it comes from**: ``predict.saved_model`` (``<dir>/latest`` already fixed to a version at submit) is copied
  to the task's directory (TF 2.21 reads no ``hdfs://``); ``predict.checkpoint`` is exported there first, by the code
  of ``tfyarn export`` (the spec's ``model:`` restored from the dir's latest checkpoint, served on its features).
* **Fixed batch**: the signature is wrapped in a ``tf.function`` whose inputs are ``[batch_size, ...]``, traced once;
  the last batch of a part is padded to it (its last row repeated) and the padding's outputs dropped.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from tfyarn.predict.signature import TensorInfo, mismatches, resolve_latest
from tfyarn.spec import Data
from tfyarn.train.events import fs_path
from tfyarn.train.export import export_checkpoint

log = logging.getLogger("tfyarn.predict.model")


def fetch_saved_model(spec: Any, workdir: Path) -> tuple[Path, str]:
    """The job's model as a local SavedModel dir, and where it came from (a URL, for the summary)."""
    p = spec.predict
    dest = workdir / "model"
    if p.saved_model:
        url = resolve_latest(p.saved_model)
        fs, root = fs_path(url)
        if not fs.exists(f"{root}/saved_model.pb"):
            raise FileNotFoundError(f"predict.saved_model: no saved_model.pb in {url}")
        for path in fs.find(root):
            target = dest / path[len(root) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(path, str(target))
        return dest, url

    data = (
        spec.data
        if spec.has_data
        else Data.model_construct(train=[], features=spec.scoring_features, label=None, batch_size=1)
    )
    ck_spec = spec.model_copy(
        update={"checkpoint": spec.checkpoint.model_copy(update={"dir": p.checkpoint}), "data": data, "export": None}
    )
    got = export_checkpoint(ck_spec, scratch=workdir, to=dest.as_uri())
    return dest / str(got["version"]), f"{p.checkpoint} ({got['checkpoint']})"


class BatchModel:
    """``model(batch, n) -> {output: numpy rows [:n]}``: one call of the signature on a full batch of the fixed size
    (``n`` real rows, the rest padding)."""

    def __init__(self, local_dir: Path, signature: str, features: Mapping[str, Any], batch_size: int):
        import tensorflow as tf

        t0 = time.monotonic()
        self.loaded = tf.saved_model.load(str(local_dir))
        if signature not in self.loaded.signatures:
            raise ValueError(
                f"the SavedModel has no signature {signature!r} (it has: {', '.join(self.loaded.signatures)})"
            )
        sig = self.loaded.signatures[signature]
        specs = sig.structured_input_signature[1]
        inputs = {
            k: TensorInfo(s.dtype.name if s.dtype != tf.string else "string", tuple(s.shape.as_list()))
            for k, s in specs.items()
        }
        problems = mismatches(features, inputs)
        if problems:
            raise ValueError("the model does not take predict.features: " + "; ".join(problems))
        self.names = sorted(specs)
        self.dtypes = {k: specs[k].dtype for k in self.names}
        self.batch_size = batch_size
        fixed = {k: tf.TensorSpec([batch_size, *specs[k].shape[1:]], specs[k].dtype, name=k) for k in self.names}
        self._fn: Callable = tf.function(lambda feats: sig(**feats), input_signature=[fixed])
        self.outputs = sorted(sig.structured_outputs)
        log.info(
            "model loaded in %.2fs: inputs %s, outputs %s, batch %d",
            time.monotonic() - t0,
            self.names,
            self.outputs,
            batch_size,
        )

    def __call__(self, batch: Mapping[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        import tensorflow as tf

        B = self.batch_size
        feeds = {}
        for k in self.names:
            v = batch[k]
            if n < B:  # the last batch of a part: padded with its last row, the padding's outputs dropped
                v = np.concatenate([v[:n], np.repeat(v[n - 1 : n], B - n, axis=0)])
            feeds[k] = tf.convert_to_tensor(v, dtype=self.dtypes[k])
        out = self._fn(feeds)
        return {k: out[k].numpy()[:n] for k in self.outputs}
