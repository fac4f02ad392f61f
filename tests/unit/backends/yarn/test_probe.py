"""The probe's application (tfyarn validate --yarn --probe, issue 41): the job's environment in one container."""
import json

from yarnutil import make_spec
from tfyarn.backends.yarn import appspec, probe
from tfyarn.gateway.packaging import EnvRef


def test_the_probe_is_one_small_container_of_the_jobs_environment_running_the_check(tmp_path):
    spec = make_spec(environment={"python": "/opt/py 3/bin/python"})
    shipped = appspec.Shipped(env=EnvRef("python", "/opt/py 3/bin/python"),
                              spec_file=appspec.write_spec_file(spec, tmp_path),
                              tfyarn_src=appspec.build_tfyarn_zip(tmp_path), code=None)
    job = appspec.build_application_spec(spec, shipped)
    app = probe.probe_app(job, training=True)
    assert set(app.services) == {probe.SERVICE}
    svc = app.services[probe.SERVICE]
    assert (svc.instances, svc.max_restarts, svc.resources.memory) == (1, 0, probe.PROBE_MEMORY_MIB)
    assert set(svc.files) == {"tfyarn_src", "tfyarn-spec.json"}
    assert "'/opt/py 3/bin/python' -c " in svc.script and " probe " in svc.script
    assert 'export PYTHONPATH="$PWD/tfyarn_src' in svc.script and "-m tfyarn.task" not in svc.script
    assert probe.SERVICE in app.tags and appspec.SUPERVISED_TAG not in app.tags and app.queue == job.queue


def test_its_report_is_read_from_the_log():
    report = {"python": "/usr/bin/python3", "version": "3.11.2", "modules": {}, "missing": "cannot start: x"}
    text = f"[tfyarn] container tfyarn-probe_0 yarn=c host=h\n{probe.REPORT_MARK}{json.dumps(report)}\n"
    assert probe.parse(text) == report
    assert probe.parse("[tfyarn] container tfyarn-probe_0 yarn=c host=h\n") is None
