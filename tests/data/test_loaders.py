"""In-memory loaders and batched augmentation."""

import pytest
import torch

from lmckit.data import (
    TensorLoader,
    random_crop_flip,
)
from lmckit.errors import DataError


def test_loader_is_seeded_per_epoch_and_covers_everything():
    x, y = torch.arange(50).float()[:, None], torch.arange(50)
    loader = TensorLoader(x, y, batch_size=8, shuffle=True, seed=4)
    e0 = torch.cat([b for _, b in loader])
    e1 = torch.cat([b for _, b in loader])
    assert sorted(e0.tolist()) == list(range(50)) and not torch.equal(e0, e1)
    loader.set_epoch(0)
    assert torch.equal(torch.cat([b for _, b in loader]), e0)
    assert len(TensorLoader(x, y, batch_size=8, drop_last=True)) == 6
    with pytest.raises(DataError, match="50 examples but y has 3"):
        TensorLoader(x, y[:3])


def test_random_crop_flip_returns_crops_of_the_padded_image():
    x = torch.randn(16, 3, 32, 32)
    out = random_crop_flip(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(16):
        found = any(
            torch.equal(out[i], padded[i, :, dy : dy + 32, dx : dx + 32])
            or torch.equal(out[i], padded[i, :, dy : dy + 32, dx : dx + 32].flip(-1))
            for dy in range(9)
            for dx in range(9)
        )
        assert found
