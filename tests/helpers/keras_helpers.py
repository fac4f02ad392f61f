"""Shared by the Keras/entrypoint tests (tests/train) and their cluster half (tests/yarn): docs/models.md's example
scripts, and the tf_keras requirement (installed with --no-deps by .ci/run)."""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def doc_examples() -> dict[str, str]:
    """docs/models.md's scripts, by the file name in the ``<!-- example: NAME -->`` line above each."""
    text = (ROOT / "docs" / "models.md").read_text()
    return dict(re.findall(r"<!-- example: (\S+) -->\n```python\n(.*?)```", text, re.DOTALL))


def require_tf_keras() -> None:
    """Skipped outside CI when tf_keras is missing; a failure in CI (TFYARN_REQUIRE_TF_KERAS=1, set by .ci/run)."""
    if os.environ.get("TFYARN_REQUIRE_TF_KERAS") == "1":
        import tf_keras  # noqa: F401
    else:
        pytest.importorskip("tf_keras")


#: The tutorial's MNIST as tfyarn features (docs/models.md, "Multi-worker training with Keras").
DIGIT_FEATURES = {"image": {"dtype": "float32", "shape": [28, 28]}, "label": {"dtype": "int64"}}


def write_digits(url_dir: str, records: int, files: int = 4, seed: int = 0) -> str:
    """MNIST-like TFRecords (a fixed 28x28 pattern per class, pixel values 0-255, plus noise) under ``url_dir``
    (any fsspec URL: hdfs:// for the YARN suite), in ``files`` shards of uneven size; returns their glob. No
    download: CI has no network."""
    import numpy as np

    from tfyarn.data.example import encode_example
    from tfyarn.data.tfrecord import TFRecordWriter

    import fsspec

    fs, root = fsspec.core.url_to_fs(url_dir)
    fs.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    protos = rng.uniform(0, 255, size=(10, 28, 28))
    sizes = [records // files + (1 if i < records % files else 0) for i in range(files)]
    sizes = [n + d for n, d in zip(sizes, [17, -17, 5, -5][:files] + [0] * max(0, files - 4))] if files >= 2 else sizes
    for i, n in enumerate(sizes):
        labels = rng.integers(0, 10, n)
        images = np.clip(protos[labels] * 0.6 + rng.uniform(0, 102, size=(n, 28, 28)), 0, 255).astype("float32")
        with TFRecordWriter(f"{url_dir.rstrip('/')}/train-{i:03d}.tfrecord") as w:
            for img, lab in zip(images, labels):
                w.write(encode_example({"image": img, "label": np.int64(lab)}, {"image": "float", "label": "int64"}))
    return url_dir.rstrip("/") + "/train-*.tfrecord"
