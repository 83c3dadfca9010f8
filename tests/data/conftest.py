import pytest

import lmckit.data.datasets as ds


@pytest.fixture(autouse=True)
def isolated_lookup(tmp_path, monkeypatch):
    """No test sees the machine's real datasets, cache or network by accident."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LMCKIT_DATA", raising=False)
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-package")
