"""A SavedModel's signature read without TensorFlow (protobuf descriptors over saved_model.pb), against the SavedModel
tfyarn's own export writes; and each mismatch with the spec's features said in one line naming both sides."""
import subprocess
import sys

import pytest

from predictutil import write_model
from tfyarn.predict.signature import TensorInfo, mismatches, read_signature, resolve_latest
from tfyarn.spec import Feature


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pytest.importorskip("tensorflow")
    return write_model(tmp_path_factory.mktemp("models"), version=12)


def test_the_exported_signature_is_read_without_tensorflow(model_dir):
    code = (
        "import sys; from tfyarn.predict.signature import read_signature\n"
        f"i, o = read_signature({str(model_dir)!r}, 'serving_default')\n"
        "assert 'tensorflow' not in sys.modules\n"
        "print(sorted((k, v.dtype, v.shape) for k, v in i.items()), sorted((k, v.dtype) for k, v in o.items()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == (
        "[('item_id', 'int64', (None,)), ('user_id', 'int64', (None,))] [('predictions', 'float32')]"
    )


def test_mismatches_name_both_sides(model_dir):
    inputs, _ = read_signature(str(model_dir), "serving_default")
    ok = {"user_id": Feature(dtype="int64"), "item_id": Feature(dtype="int64"), "extra": Feature(dtype="string")}
    assert mismatches(ok, inputs) == []
    assert mismatches({"user_id": Feature(dtype="int64")}, inputs) == [
        "the model's input 'item_id' (int64) is not among predict.features (user_id)"
    ]
    assert mismatches({"user_id": Feature(dtype="int64"), "item_id": Feature(dtype="float32")}, inputs) == [
        "the model's input 'item_id' is int64, predict.features.item_id is float32"
    ]
    shaped = {"x": TensorInfo("float32", (None, 4))}
    assert mismatches({"x": Feature(dtype="float32", shape=[3])}, shaped) == [
        "the model's input 'x' has shape ['batch', 4], predict.features.x shape [3]"
    ]
    with pytest.raises(ValueError, match="no signature 'other'"):
        read_signature(str(model_dir), "other")


def test_latest_is_the_newest_numbered_version(tmp_path):
    for name in ("3", "12", ".tmp-x-20", "notes"):
        (tmp_path / name).mkdir()
    assert resolve_latest(f"{tmp_path}/latest") == f"{tmp_path}/12"
    assert resolve_latest(f"{tmp_path}/3") == f"{tmp_path}/3"
    with pytest.raises(FileNotFoundError, match="no numbered SavedModel version"):
        resolve_latest(f"{tmp_path}/notes/latest")
