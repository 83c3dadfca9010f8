"""Write the Hugging Face model folders that ``bench_large.py`` matches: two seeds each of a
GPT-2-small config (124 M parameters) and of a 1.1 B-parameter Llama config (TinyLlama's
shape: hidden 2048, MLP 5632, 22 layers, 32 heads / 4 key-value heads), random-initialised
with ``transformers`` and saved in ``save_pretrained``'s sharded safetensors (1 GB shards
for the Llama, so that the folder is sharded as released checkpoints are).

    python benchmarks/make_hf_pairs.py OUT [--only gpt2-124m|llama-1.1b]

A folder that already holds ``config.json`` is kept. Prints one JSON line per folder.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

CONFIGS = {
    "gpt2-124m": ("GPT2Config", "GPT2LMHeadModel", {}, "5GB"),
    "llama-1.1b": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 22,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
            "max_position_embeddings": 2048,
        },
        "1GB",
    ),
}


def make(out: Path, name: str, seed: int) -> dict:
    import transformers

    config_cls, model_cls, kwargs, shard = CONFIGS[name]
    folder = out / f"{name}-seed{seed}"
    if (folder / "config.json").is_file():
        return {"folder": str(folder), "kept": True}
    start = time.perf_counter()
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**kwargs)
    model = getattr(transformers, model_cls)(config)
    built = time.perf_counter() - start
    model.save_pretrained(folder, max_shard_size=shard)
    params = sum(p.numel() for p in model.parameters())
    return {
        "folder": str(folder),
        "parameters": params,
        "build_seconds": round(built, 1),
        "save_seconds": round(time.perf_counter() - start - built, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", choices=sorted(CONFIGS))
    args = parser.parse_args()
    for name in [args.only] if args.only else list(CONFIGS):
        for seed in (0, 1):
            print(json.dumps(make(args.out, name, seed)), flush=True)


if __name__ == "__main__":
    main()
