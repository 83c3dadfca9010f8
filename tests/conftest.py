import os

import pytest
import torch

from tests.zoo import train_mlp

# The device the device-parity tests (tests/test_device.py) run on: `cpu` here, `cuda` on a
# GPU machine (LMCKIT_TEST_DEVICE=cuda make test). A device that is not there is an error.
TEST_DEVICE = os.environ.get("LMCKIT_TEST_DEVICE", "cpu")


def pytest_configure(config):
    # Under pytest-xdist (`-n N`) every worker would otherwise run torch with one thread per
    # core: N × cores spinning threads on `cores` cores, and a fixture that trains in a
    # second alone timed out after 100 s on a 16-core GPU machine with 14 workers.
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
    try:
        torch.empty(1, device=TEST_DEVICE)
    except (RuntimeError, AssertionError) as exc:
        raise pytest.UsageError(
            f"LMCKIT_TEST_DEVICE={TEST_DEVICE!r} is not usable: {exc}"
        ) from None


@pytest.fixture(scope="session")
def device():
    """``torch.device`` of LMCKIT_TEST_DEVICE (default cpu)."""
    return torch.device(TEST_DEVICE)


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def digits():
    """scikit-learn's bundled 8×8 digits (1,437 train / 360 test)."""
    from lmckit.data import load_dataset

    return load_dataset("digits")


@pytest.fixture(scope="session")
def digits_pair(digits):
    """``(model, params_a, params_b)``: two 64-64 MLPs trained 8 epochs on digits from
    seeds 0 and 1 (``model`` holds A's weights). Treat the dicts as read-only."""
    a, b = train_mlp(digits, 0), train_mlp(digits, 1)
    return a, clone(a.state_dict()), clone(b.state_dict())


def clone(params):
    return {k: v.clone() for k, v in params.items()}
