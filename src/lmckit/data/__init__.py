"""Datasets (IDX, CIFAR, digits, synthetic), loaders and the papers' splits."""

from lmckit.data.cifar import read_cifar_batch, write_cifar_batch
from lmckit.data.datasets import (
    DATASETS,
    Batches,
    Dataset,
    DataSource,
    as_batches,
    canonical_name,
    fashion_mnist_available,
    load_dataset,
    make_synthetic,
)
from lmckit.data.idx import read_idx, write_idx
from lmckit.data.loaders import TensorLoader, random_crop_flip
from lmckit.data.splits import (
    SPLIT_KINDS,
    Split,
    class_imbalanced_split,
    dirichlet_split,
    holdout_split,
    indices_digest,
    random_partition,
    random_subset,
)

__all__ = [
    "DATASETS",
    "SPLIT_KINDS",
    "Batches",
    "DataSource",
    "Dataset",
    "Split",
    "TensorLoader",
    "as_batches",
    "canonical_name",
    "class_imbalanced_split",
    "dirichlet_split",
    "fashion_mnist_available",
    "holdout_split",
    "indices_digest",
    "load_dataset",
    "make_synthetic",
    "random_crop_flip",
    "random_partition",
    "random_subset",
    "read_cifar_batch",
    "read_idx",
    "write_cifar_batch",
    "write_idx",
]
