"""How much of a planted symmetry of a grouped-query Llama weight matching takes back.

A small random Llama (float64; 4 query heads sharing 2 key/value heads, head size 8, two
layers) is moved by an element of its attention's symmetry group that keeps its function
exactly, built here by hand from the model's layout (not from lmckit's spec):

- ``kv``: the key/value heads permuted, each with its query heads;
- ``q-in-group``: the query heads permuted inside their key/value group;
- ``value-dims``: each key/value head's value dimensions permuted (the output projection's
  columns of its query heads alike);
- ``rotary-pairs``: per key/value head, a 2 × 2 rotation of each rotary frequency pair
  ``(j, j + d/2)`` on its queries and keys (they commute with the rotary embedding).

For each combination, weight matching on the traced spec (``wm``, permutations) and
``wm-orth`` (orthogonal maps too) are asked to undo it; printed (JSON): the share of the
planted distance ``‖A − B‖`` left, ``‖A − aligned B‖ / ‖A − B‖`` (0: undone, 1: nothing
undone), and that the moved model computes A's function (relative output change). Run
from the repository root: ``python scripts/gqa_planted.py``.
"""

from __future__ import annotations

import json
import math
import sys

import torch

KV, REP, HEAD, WIDTH, LAYERS = 2, 2, 8, 32, 2


def model():
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=WIDTH, intermediate_size=48, num_hidden_layers=LAYERS,
        num_attention_heads=KV * REP, num_key_value_heads=KV, head_dim=HEAD,
        max_position_embeddings=32, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).double().eval()


def moving(n: int, g: torch.Generator) -> torch.Tensor:
    """A random permutation of ``n`` that is not the identity."""
    while True:
        p = torch.randperm(n, generator=g)
        if not torch.equal(p, torch.arange(n)):
            return p


def plant(a: dict, parts: set[str], seed: int) -> dict:
    """``a`` moved by a random element of the named parts of the attention's group."""
    g = torch.Generator().manual_seed(seed)
    b = {k: v.clone() for k, v in a.items()}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}.self_attn."
        q = a[pre + "q_proj.weight"].view(KV, REP, HEAD, WIDTH)
        k = a[pre + "k_proj.weight"].view(KV, HEAD, WIDTH)
        v = a[pre + "v_proj.weight"].view(KV, HEAD, WIDTH)
        o = a[pre + "o_proj.weight"].view(WIDTH, KV, REP, HEAD)
        kv = moving(KV, g) if "kv" in parts else torch.arange(KV)
        q, k, v, o = q[kv], k[kv], v[kv], o[:, kv]
        for i in range(KV):
            if "q-in-group" in parts:
                tau = moving(REP, g)
                q[i], o[:, i] = q[i][tau], o[:, i][:, tau]
            if "value-dims" in parts:
                sigma = moving(HEAD, g)
                v[i], o[:, i] = v[i][sigma], o[:, i][:, :, sigma]
            if "rotary-pairs" in parts:
                r = torch.eye(HEAD, dtype=torch.float64)
                half = HEAD // 2
                for j in range(half):
                    angle = float(torch.rand(1, generator=g)) * 2 * math.pi
                    c, s = math.cos(angle), math.sin(angle)
                    r[j, j], r[j, j + half], r[j + half, j], r[j + half, j + half] = c, -s, s, c
                q[i], k[i] = torch.einsum("de,rew->rdw", r, q[i]), r @ k[i]
        b[pre + "q_proj.weight"] = q.reshape(-1, WIDTH).contiguous()
        b[pre + "k_proj.weight"] = k.reshape(-1, WIDTH).contiguous()
        b[pre + "v_proj.weight"] = v.reshape(-1, WIDTH).contiguous()
        b[pre + "o_proj.weight"] = o.reshape(WIDTH, -1).contiguous()
    return b


def distance(x: dict, y: dict) -> float:
    return math.sqrt(sum(float(((x[k] - y[k]) ** 2).sum()) for k in x))


def main() -> None:
    from lmckit.match import METHODS
    from lmckit.tracing import trace
    from lmckit.transform import fold_norms

    m = model()
    tokens = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    spec = trace(m, tokens[:2])
    a = {k: v.detach().clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        reference = m(tokens).logits
    combinations = {
        "kv": {"kv"},
        "kv + value-dims": {"kv", "value-dims"},
        "q-in-group": {"q-in-group"},
        "kv + q-in-group + value-dims": {"kv", "q-in-group", "value-dims"},
        "rotary-pairs": {"rotary-pairs"},
        "all": {"kv", "q-in-group", "value-dims", "rotary-pairs"},
    }
    rows = {}
    for name, parts in combinations.items():
        b = plant(a, parts, seed=3)
        with torch.no_grad():
            out = torch.func.functional_call(m, b, (tokens,)).logits
        row = {
            "planted_distance": distance(a, b),
            "function_change": float((out - reference).abs().max() / reference.abs().max()),
        }
        for method in ("wm", "wm-orth"):
            extra = {"model": m, "example_inputs": (tokens[:2],)} if method != "wm" else {}
            result = METHODS[method](spec, a, b, **extra)
            if method == "wm":
                left = distance(a, result.alignment.apply(b))
                start = row["planted_distance"]
            else:  # a transform of the norm-folded models
                fa, fb = fold_norms(spec, a), fold_norms(spec, b)
                left, start = distance(fa, result.alignment.apply(fb)), distance(fa, fb)
            row[f"{method}_share_left"] = left / start
        rows[name] = row
    json.dump(
        {"model": f"Llama, {LAYERS} layers, {KV * REP} query heads / {KV} key-value heads of "
         f"{HEAD}, width {WIDTH}, float64", "rows": rows},
        sys.stdout, indent=2,
    )  # fmt: skip
    print()


if __name__ == "__main__":
    main()
