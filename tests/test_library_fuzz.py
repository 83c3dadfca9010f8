"""Every public function of the library, each required argument replaced in turn by a value
of the wrong kind (None, a string, a negative number, NaN, an empty or foreign table, a
bare tensor): the answer is an LmcError naming what is wrong, never an AttributeError,
KeyError or TypeError from deep inside."""

import importlib
import inspect

import pytest
import torch

from lmckit import LmcError
from lmckit.data import load_dataset
from lmckit.models import build_model, permutation_spec

MODULES = (
    "lmckit.analysis", "lmckit.evaluate", "lmckit.match", "lmckit.merge", "lmckit.params",
    "lmckit.data", "lmckit.tracing", "lmckit.models", "lmckit.metrics", "lmckit.functional",
)  # fmt: skip
SKIP = {"download", "write_idx", "write_cifar_batch"}  # write files where they are told
BAD = (None, "x", -1, float("nan"), {}, [], {"a": torch.zeros(2)}, torch.zeros(3))


def _functions():
    for module in MODULES:
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", []):
            fn = getattr(mod, name)
            if inspect.isfunction(fn) and name not in SKIP:
                yield f"{module}.{name}", fn


@pytest.fixture(scope="module")
def good():
    torch.manual_seed(0)
    net = build_model("mlp", in_dim=64, hidden=[8, 8], out_dim=10)
    other = build_model("mlp", in_dim=64, hidden=[8, 8], out_dim=10)
    digits = load_dataset("digits")
    a, b = net.state_dict(), other.state_dict()
    return {
        "spec": permutation_spec(net), "params": a, "params_a": a, "params_b": b,
        "params_list": [a, b], "model": net, "data": digits, "loader": digits.loader("test"),
        "loaders": {"test": digits.loader("test")}, "lam": 0.5, "x": torch.randn(2, 64),
        "logits": torch.randn(5, 3), "labels": torch.zeros(5, dtype=torch.long),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("name", "fn"), list(_functions()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_wrong_kinds_of_argument_are_named_not_crashes(name, fn, good):
    required = [
        p for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]  # fmt: skip
    crashes = []
    for i, target in enumerate(required):
        for bad in BAD:
            args = [bad if j == i else good.get(p.name) for j, p in enumerate(required)]
            try:
                fn(*args)
            except LmcError:
                pass
            except TypeError as exc:  # Python's own: an argument the call itself lacks
                if "required" not in str(exc) or "missing" not in str(exc):
                    crashes.append(f"{target.name}={bad!r:.20}: TypeError: {exc}")
            except Exception as exc:
                crashes.append(f"{target.name}={bad!r:.20}: {type(exc).__name__}: {exc}")
    assert not crashes, f"{name}: " + "; ".join(crashes[:3])
