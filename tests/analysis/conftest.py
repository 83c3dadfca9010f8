import pytest

from tests.zoo import train_mlp


@pytest.fixture(scope="package")
def three(digits):
    """``(model, [params × 3])``: three 32-32 MLPs trained 10 epochs on digits."""
    models = [train_mlp(digits, seed, hidden=(32, 32), epochs=10) for seed in range(3)]
    return models[0], [m.state_dict() for m in models]
