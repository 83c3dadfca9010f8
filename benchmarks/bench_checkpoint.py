"""What verifying a checkpoint's SHA-256 costs when loading it.

Every load hashes the whole weights file (results are keyed on the bytes read, whatever the
sidecar says). For each model, one checkpoint is loaded twice over: with its sidecar as
written (format version 2: the per-chunk digests verified in parallel, and the whole-file
digest) and with a copy of the sidecar marked format version 1 without digests (the
whole-file SHA-256 computed, nothing to compare it with) — the same weights file, the same
code path otherwise. Beside them, the bare costs of the parts: reading the file's bytes,
and one SHA-256 of them on one thread. ``--repeats`` loads of each, alternating; reports
the minimum and the median. Prints one JSON.

    python benchmarks/bench_checkpoint.py [--models mlp3x512 vgg11 resnet20x16]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from statistics import median

from lmckit.checkpoint import load_checkpoint, save_checkpoint
from lmckit.train import init_model

MODELS = {
    "mlp3x512": ("mlp", {"in_dim": 784}),
    "vgg11": ("vgg", {"depth": 11, "width_multiplier": 1}),
    "resnet20x16": ("resnet20", {"width_multiplier": 16}),
}


def load_times(paths: list[Path], repeats: int) -> list[list[float]]:
    """Load each path ``repeats`` times, alternating between them so that drifts in the
    machine's speed hit every variant alike."""
    for path in paths:
        load_checkpoint(path)
    times: list[list[float]] = [[] for _ in paths]
    for _ in range(repeats):
        for i, path in enumerate(paths):
            t = time.perf_counter()
            load_checkpoint(path)
            times[i].append(time.perf_counter() - t)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models:
            name, config = MODELS[key]
            weights = save_checkpoint(Path(tmp) / key, init_model(name, config, seed=0))
            sidecar = weights.with_suffix(".json")
            meta = json.loads(sidecar.read_text())
            unchecked = Path(tmp) / f"{key}-v1"
            shutil.copy(weights, unchecked.with_suffix(".safetensors"))
            legacy = {k: v for k, v in meta.items() if not k.startswith("weights_sha256")}
            unchecked.with_suffix(".json").write_text(json.dumps({**legacy, "format_version": 1}))
            verified, plain = load_times([weights, unchecked], args.repeats)
            reads, hashes = [], []
            for _ in range(args.repeats):
                t = time.perf_counter()
                data = weights.read_bytes()
                reads.append(time.perf_counter() - t)
                t = time.perf_counter()
                hashlib.sha256(data).hexdigest()
                hashes.append(time.perf_counter() - t)
            rows.append(
                {
                    "model": key,
                    "megabytes": weights.stat().st_size / 1e6,
                    "load_seconds_verified": {"min": min(verified), "median": median(verified)},
                    "load_seconds_whole_digest_only": {"min": min(plain), "median": median(plain)},
                    "read_bytes_seconds": {"min": min(reads), "median": median(reads)},
                    "sha256_one_thread_seconds": {"min": min(hashes), "median": median(hashes)},
                    "overhead_of_min": min(verified) / min(plain) - 1,
                    "overhead_of_median": median(verified) / median(plain) - 1,
                }
            )
    print(json.dumps({"benchmark": "checkpoint_load_sha256", "results": rows}, indent=2))


if __name__ == "__main__":
    main()
