"""What the forkserver imports before forking: TF without its eager Keras import, Keras only for model code that
uses it (read statically: the job's code is never run in the server)."""
import json
import subprocess
import sys
import textwrap

import pytest

from tfyarn.task.warm_imports import code_uses_keras, model_module


def write(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(root)


@pytest.mark.parametrize("line", [
    "import keras", "import keras.layers as kl", "from keras import layers", "import tf_keras as keras2",
    "from tensorflow import keras", "from tensorflow import nn, keras", "from tensorflow.keras import layers",
    "import tensorflow.keras", "layer = tf.keras.layers.Dense(1)",
])
def test_each_way_of_reaching_keras_is_seen_through_the_jobs_own_imports(tmp_path, line):
    code = write(tmp_path, {
        "job/__init__.py": "",
        "job/model.py": "import numpy as np\nfrom .nets import tower\nfrom job import util\n",
        "job/util.py": "import os\n",
        "job/nets/__init__.py": "from .tower import tower\n",
        "job/nets/tower.py": f"import tensorflow as tf\n\ndef tower():\n    {line}\n",
    })
    assert code_uses_keras("job.model", code)
    assert not code_uses_keras("job.util", code)  # util imports nothing that reaches Keras


def test_absolute_and_from_package_imports_are_followed(tmp_path):
    code = write(tmp_path, {
        "trainer.py": "from helpers import layers\n",       # `from package import submodule`
        "helpers/__init__.py": "",
        "helpers/layers.py": "import common.blocks\n",
        "common/__init__.py": "",
        "common/blocks.py": "from tensorflow import keras\n",
    })
    assert code_uses_keras("trainer", code)


def test_libraries_are_not_followed_and_import_cycles_end(tmp_path, monkeypatch):
    site = write(tmp_path / "site", {"somelib/__init__.py": "import keras\n"})
    monkeypatch.syspath_prepend(site)
    code = write(tmp_path / "code", {
        "a.py": "import b\nimport somelib\nimport tensorflow as tf\n",
        "b.py": "from a import x\nx = 1\n",
    })
    assert not code_uses_keras("a", code)  # somelib uses Keras, but it is a library: its tasks import what they use


def test_tfyarns_own_models_do_not_use_keras():
    # (guards the launch time of every job on the built-in models: tfyarn's modules they import must not mention it)
    assert not code_uses_keras("tfyarn.models.recommender")
    assert not code_uses_keras("tfyarn.models.logreg")


def test_unknown_modules_and_unreadable_specs_mean_no_keras(tmp_path):
    assert not code_uses_keras("no_such_module_anywhere", str(tmp_path))
    assert not code_uses_keras("json")  # a module of the standard library: nothing of it is read as the job's code
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": "pkg.mod:build"}))
    assert model_module(str(spec)) == "pkg.mod"
    spec.write_text("{not json")
    assert model_module(str(spec)) is None
    assert model_module(str(tmp_path / "missing.json")) is None and model_module(None) is None


def test_tensorflow_imported_without_keras_imports_it_on_first_use():
    code = textwrap.dedent("""
        import json, sys
        from tfyarn.task.warm_imports import import_tensorflow, KERAS_EAGER_IMPORTS
        import_tensorflow()
        import tensorflow as tf
        before = "keras" in sys.modules
        leftover = [n for n in KERAS_EAGER_IMPORTS if n in sys.modules]
        out = tf.keras.layers.Dense(1, kernel_initializer="ones")(tf.ones([2, 3]))
        print(json.dumps({"before": before, "leftover": leftover, "after": "keras.src.optimizers" in sys.modules,
                          "out": out.numpy().tolist()}))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"before": False, "leftover": [], "after": True, "out": [[3.0], [3.0]]}
