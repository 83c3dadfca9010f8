"""Does aligning the weights better over orthogonal maps connect the models better? Along
``wm-orth``'s descent on trained pairs, the weight objective ⟨θ_A, T(θ_B)⟩ and the test
loss at the midpoint, side by side.

For each pair of lmckit checkpoints (``--pair A B``; the Llama study's, trained on
``python-stdlib``, or ViTs with ``--dataset fashion-mnist``): the traced spec's kinds
(distance-keeping part), both models' norm gains folded, permutation weight matching,
then the orthogonal descent stopped after each of ``--sweeps`` sweeps (0: WM's
permutations alone). At each stop: the weight distance
``‖θ_A − T(θ_B)‖``, and the test loss (nats per token or per image) at λ = 0, ½, 1 on the
first ``--windows`` test examples, with the barrier at ½. Then, for each family of maps
alone — the residual stream's rotation, the rotary pairs' rotations, the other head maps
(``"value maps"``: a rotary decoder's value maps; a ViT's query/key and value maps) — made
continuous (every other group permutations only), the same after ``--family-sweeps``
sweeps: which maps move the barrier. Prints one JSON document.

    python scripts/wm_orth_objective_vs_barrier.py --pair A.safetensors B.safetensors \\
        [--sweeps 0 1 3 10 30 100] [--family-sweeps 30] [--windows 512]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from lmckit.checkpoint import load_checkpoint
from lmckit.data import load_dataset
from lmckit.match.orthogonal import orthogonal_weight_matching
from lmckit.match.weight import weight_matching
from lmckit.tracing import symmetry_kinds
from lmckit.transform import Transform, fold_norms, orthogonal_subgroup


def mean_loss(model, params, x, y, batch: int = 64) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logits = torch.func.functional_call(model, params, (x[i : i + batch],))
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y[i : i + batch].reshape(-1), reduction="sum"
            )
            total, count = total + float(loss), count + y[i : i + batch].numel()
    return total / count


def at_stop(model, spec, fa, fb, init, sweeps: int, x, y, ends) -> dict:
    """Distance and midpoint loss after ``sweeps`` sweeps of the orthogonal descent over
    ``spec`` from ``init`` (0: ``init`` itself, a permutation)."""
    if sweeps == 0:
        t = Transform.from_permutation(init)
    else:
        t = orthogonal_weight_matching(
            spec, fa, fb, init=init, max_iter=sweeps, gain_tol=0
        ).alignment
    moved = t.apply(fb)
    mid = {k: (fa[k] + moved[k]) / 2 if fa[k].is_floating_point() else fa[k] for k in fa}
    loss = mean_loss(model, mid, x, y)
    distance = sum(float(((fa[k] - moved[k]) ** 2).sum()) for k in fa) ** 0.5
    return {
        "sweeps": sweeps, "distance": distance, "midpoint_loss": loss,
        "barrier": loss - (ends[0] + ends[1]) / 2,
    }  # fmt: skip


def families(kinds) -> dict[str, list[str]]:
    """The groups of each family of continuous maps: the stream, the rotary pairs, the
    other head-structured groups (``"value maps"``)."""
    rotary = [g for g in kinds.kinds if kinds.kind(g).startswith("rotary")]
    return {
        "stream": [g for g in kinds.kinds if g not in kinds.heads],
        "rotary pairs": rotary,
        "value maps": [g for g in kinds.kinds if g in kinds.heads and g not in rotary],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"), required=True)
    parser.add_argument("--sweeps", type=int, nargs="+", default=[0, 1, 3, 10, 30, 100])
    parser.add_argument("--family-sweeps", type=int, default=30)
    parser.add_argument("--windows", type=int, default=512, help="test examples evaluated")
    parser.add_argument(
        "--dataset", default="python-stdlib", help="the pairs' dataset (default python-stdlib)"
    )
    args = parser.parse_args()
    data = load_dataset(args.dataset)
    x, y = data.test_x[: args.windows], data.test_y[: args.windows]
    out = []
    for path_a, path_b in args.pair:
        a, b = load_checkpoint(path_a), load_checkpoint(path_b)
        model = a.model.eval()
        kinds = orthogonal_subgroup(symmetry_kinds(model, x[:2], a.spec).spec)
        fa, fb = fold_norms(kinds, a.params), fold_norms(kinds, b.params)
        ends = mean_loss(model, fa, x, y), mean_loss(model, fb, x, y)
        label = [path_a[-20:], path_b[-20:]]
        wm = weight_matching(kinds, fa, fb).perm
        rows = []
        for sweeps in args.sweeps:
            rows.append(at_stop(model, kinds, fa, fb, wm, sweeps, x, y, ends))
            print(json.dumps({"pair": label, **rows[-1]}), flush=True)
        alone = {}
        for family, groups in families(kinds).items():
            spec = dataclasses.replace(
                kinds,
                kinds={g: kinds.kind(g) for g in groups},
                rotary={g: v for g, v in kinds.rotary.items() if g in groups},
            )
            row = at_stop(model, spec, fa, fb, wm, args.family_sweeps, x, y, ends)
            alone[family] = {"groups": len(groups), **row}
            print(json.dumps({"pair": label, family: alone[family]}), flush=True)
        out.append(
            {"pair": [path_a, path_b], "endpoint_losses": ends, "stops": rows, "alone": alone}
        )
    print(json.dumps({"windows": args.windows, "pairs": out}, indent=2))


if __name__ == "__main__":
    main()
