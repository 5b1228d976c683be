"""A missing dev dependency fails the suite under `make test` and in CI, and skips elsewhere."""

import pytest
from conftest import require

MISSING = "jaxdist_no_such_dev_dependency"


@pytest.mark.parametrize("var", ["JAXDIST_REQUIRE_DEV", "CI"])
def test_a_missing_dev_dependency_fails_where_required(monkeypatch, var):
    monkeypatch.delenv("JAXDIST_REQUIRE_DEV", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv(var, "true")
    with pytest.raises(ModuleNotFoundError, match=MISSING):
        require(MISSING)


def test_a_missing_dev_dependency_skips_elsewhere(monkeypatch):
    monkeypatch.delenv("JAXDIST_REQUIRE_DEV", raising=False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require(MISSING)
    assert require("numpy").__name__ == "numpy"


def test_make_test_requires_the_dev_extra():
    from pathlib import Path

    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    test_target = makefile.split("\ntest:")[1].split("\n\n")[0]
    assert "JAXDIST_REQUIRE_DEV=1" in test_target and "-m pytest" in test_target
