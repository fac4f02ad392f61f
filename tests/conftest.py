import pytest


@pytest.fixture(autouse=True)
def tfyarn_home(tmp_path, monkeypatch):
    """Every test gets its own TFYARN_HOME, so local apps never mix between tests or with the user's."""
    home = tmp_path / "tfyarn-home"
    monkeypatch.setenv("TFYARN_HOME", str(home))
    return home
