from tfyarn.train import child_check


def test_problems_are_printed_one_per_line_and_exit_2_none_exit_0(tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text('{"model": "m"}')
    seen = []

    def two(text):
        seen.append(text)
        return ["model: not compiled", "roles.ps.memory: too small"]

    assert child_check.run(two, ["prog", str(spec)]) == 2
    assert seen == ['{"model": "m"}']
    assert capsys.readouterr().out == "model: not compiled\nroles.ps.memory: too small\n"
    assert child_check.run(lambda text: [], ["prog", str(spec)]) == 0
    assert capsys.readouterr().out == ""
