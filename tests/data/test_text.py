"""The ``python-stdlib`` code corpus: which files, which split, which windows — checked
against a source tree the tests write and an independent re-derivation of the split."""

import hashlib
import sys

import pytest
import torch

from lmckit.data import load_dataset
from lmckit.data.text import corpus_files, load_code_corpus
from lmckit.errors import DataError, DatasetNotFoundError


def independent_is_test(relative: str) -> bool:
    return int(hashlib.sha256(relative.encode()).hexdigest()[:8], 16) < 429496729


def write_tree(root, count=40):
    """``count`` modules at the top, one in a package, and files that must be left out."""
    texts = {}
    for i in range(count):
        texts[f"m{i:02d}.py"] = f"def f{i}(x):\n    return x * {i}  # é\n" * (i + 3)
    for j in range(6):  # the same name in several packages: the split hashes the path
        texts[f"pkg{j}/helpers.py"] = f"import os\nprint(os.sep, {j})\n" * 20
    for rel, text in texts.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    for skipped in ("test/t.py", "pkg/tests/t.py", "__pycache__/c.py", "site-packages/x.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("SKIPPED = True\n" * 50)
    (root / "notes.txt").write_text("not python\n" * 50)
    return texts


def test_split_by_file_name_windows_and_next_byte_targets(tmp_path):
    texts = write_tree(tmp_path)
    data = load_code_corpus(tmp_path, context=16)
    names = sorted(texts)
    assert [p.relative_to(tmp_path).as_posix() for p in corpus_files(tmp_path)] == names
    test_names = [n for n in names if independent_is_test(n)]
    assert 0 < len(test_names) < len(names)  # this tree has files in both splits
    train_names = [n for n in names if n not in test_names]
    for split, chosen in (("train", train_names), ("test", test_names)):
        stream = b"".join(texts[n].encode() for n in chosen)
        x, y = (data.train_x, data.train_y) if split == "train" else (data.test_x, data.test_y)
        count = (len(stream) - 1) // 16
        expected = torch.tensor(list(stream), dtype=torch.int64)
        assert x.shape == y.shape == (count, 16) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x.flatten(), expected[: count * 16])
        assert torch.equal(y.flatten(), expected[1 : count * 16 + 1])
    assert data.num_classes == 256 and data.input_shape == (16,)
    assert b"SKIPPED" not in bytes(data.train_x.flatten().tolist())
    version = ".".join(map(str, sys.version_info[:3]))
    assert f"Python {version}" in data.source and str(tmp_path) in data.source


def test_by_name_with_a_folder_and_its_alias(tmp_path):
    write_tree(tmp_path)
    data = load_dataset("stdlib", tmp_path)
    assert data.name == "python-stdlib" and data.input_shape == (128,)
    with pytest.raises(DataError, match="takes no pad_to"):
        load_dataset("python-stdlib", tmp_path, pad_to=32)


def test_the_interpreters_own_standard_library_loads():
    data = load_dataset("python-stdlib")
    assert len(data.train_x) > 20 * len(data.test_x) / 10  # most files train, ~1 in 10 test
    assert data.train_x.max() < 256 and data.train_x.min() >= 0


def test_bad_corpora_are_named(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_code_corpus(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "test").mkdir()
    (tmp_path / "empty" / "test" / "only_tests.py").write_text("x = 1\n")
    with pytest.raises(DatasetNotFoundError, match=r"no \*\.py file under"):
        load_code_corpus(tmp_path / "empty")
    one = tmp_path / "one"
    one.mkdir()
    name = next(f"a{i}.py" for i in range(100) if not independent_is_test(f"a{i}.py"))
    (one / name).write_text("x = 1\n" * 100)
    with pytest.raises(DataError, match="none of them in the test split"):
        load_code_corpus(one)
    write_tree(tmp_path / "small", count=12)
    with pytest.raises(DataError, match="fewer than one window"):
        load_code_corpus(tmp_path / "small", context=100_000)
    with pytest.raises(DataError, match="context must be a positive integer"):
        load_code_corpus(tmp_path / "small", context=0)


def test_class_based_splits_refuse_next_token_targets_and_random_ones_work(tmp_path):
    from lmckit.data.splits import Split

    write_tree(tmp_path)
    data = load_code_corpus(tmp_path, context=16)
    for kind, extra in (("class-imbalanced", {}), ("dirichlet", {"clients": 2, "alpha": 0.5})):
        split = Split.from_dict({"kind": kind, "part": 0, **extra})
        with pytest.raises(DataError, match=r"one label per example.*kind = 'random'"):
            split.indices(data.train_y, data.num_classes)
    halves = [Split.from_dict({"kind": "random", "part": p, "clients": 2}) for p in (0, 1)]
    parts = [h.indices(data.train_y, data.num_classes) for h in halves]
    assert sorted(torch.cat(parts).tolist()) == list(range(len(data.train_y)))


def test_windows_are_every_whole_window_with_its_next_byte_by_brute_force(tmp_path):
    """For every stream length around the multiples of the context — exactly k·context,
    one more, one less — the windows are all the non-overlapping ones whose next byte
    exists, none lost and none miscounted."""
    from lmckit.data.text import _windows

    context = 5
    stream = bytes(range(7, 7 + 4 * context + 3))
    for length in range(1, len(stream) + 1):
        part = stream[:length]
        expected = [
            (list(part[i : i + context]), list(part[i + 1 : i + context + 1]))
            for i in range(0, length, context)
            if i + context + 1 <= length
        ]
        if not expected:
            with pytest.raises(DataError, match="fewer than one window"):
                _windows(part, context, "train", tmp_path)
            continue
        x, y = _windows(part, context, "train", tmp_path)
        assert [(a.tolist(), b.tolist()) for a, b in zip(x, y, strict=True)] == expected, length
