"""The keytab is a password: it must never reach a log, the KV, a task's environment, the status or the summary, and
a world-readable one is refused before anything is shipped. Real local job (custom train dumping the KV and env)."""
import json
import stat

import pytest

from faultutil import JOBS
from launch_helpers import small_spec
from tfyarn import api
from tfyarn.backends.base import AppState
from tfyarn.backends.local.backend import LocalBackend
from tfyarn.spec import load_spec_dict

SECRET = b"\x05\x02TFYARN-KEYTAB-SECRET-7f3a9c"


@pytest.mark.timeout(120)
def test_keytab_never_in_logs_kv_env_status_or_summary(tmp_path):
    kt = tmp_path / "svc.keytab"
    kt.write_bytes(SECRET)
    kt.chmod(0o600)
    spec = load_spec_dict(small_spec(tmp_path, model="fault_models:dump_kv_and_env", code=str(JOBS),
                                     kerberos={"principal": "svc@EXAMPLE.COM", "keytab": str(kt)}))
    backend = LocalBackend()
    st = api.run(spec, backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    seen = st.summary
    assert seen["kv"] and seen["env"]["TFYARN_ROLE"] == "chief"     # the dump really happened
    app = backend.app_dir(st.app_id)
    texts = {"summary": json.dumps(seen), "status.json": (app / "status.json").read_text(),
             **{str(p.relative_to(app)): p.read_text(errors="replace") for p in app.rglob("*.log")}}
    secret = SECRET.decode(errors="replace").strip("\x05\x02")
    for name, text in texts.items():
        assert secret not in text, f"keytab content in {name}"
    assert not any(str(kt) in v for v in seen["env"].values()), "keytab path in a task's environment"
    assert not any(str(kt) in v for v in seen["kv"].values()), "keytab path in the KV"


def test_world_readable_keytab_is_refused_naming_the_fix(tmp_path):
    from tfyarn.cluster import hdfs
    from tfyarn.errors import TfyarnError
    kt = tmp_path / "svc.keytab"
    kt.write_bytes(SECRET)
    kt.chmod(0o644)
    with pytest.raises(TfyarnError) as e:
        hdfs.check_keytab(kt)
    assert "world-readable (mode 644)" in str(e.value) and "chmod 600" in str(e.value)
    assert SECRET.decode(errors="replace") not in str(e.value)
    kt.chmod(0o600)
    hdfs.check_keytab(kt)
    assert not kt.stat().st_mode & stat.S_IROTH
