"""The table of symmetry kinds (`lmckit.kinds.KINDS`): each row's callables agree with its
flags on random elements, every matcher's fit table covers the kinds it meets, the tracer
tries the kinds its rules allowed before the table, and no module outside the table compares
kind names."""

import ast
import itertools
from pathlib import Path

import pytest
import torch

from lmckit.errors import PermutationError
from lmckit.kinds import KINDS, GroupFacts, mean_free_basis, tried_kinds

MATRIX_KINDS = [name for name, row in KINDS.items() if row.matrix]


@pytest.mark.parametrize("name", MATRIX_KINDS)
def test_each_rows_draw_check_inverse_and_flags_agree(name):
    row, n = KINDS[name], 5
    g = torch.Generator().manual_seed(0)
    m = row.random(n, g, torch.float64)
    row.check("g", name, m, torch.float64)  # a draw is an element
    assert torch.allclose(row.inverse(m) @ m, torch.eye(n, dtype=torch.float64), atol=1e-10)
    is_orthogonal = torch.allclose(m @ m.T, torch.eye(n, dtype=torch.float64), atol=1e-10)
    assert row.orthogonal == is_orthogonal
    assert row.dual == (not row.orthogonal)  # readers move by M⁻ᵀ, which is M when orthogonal
    narrowed = KINDS[row.narrowed]
    assert narrowed.orthogonal  # the subgroup weight matching searches keeps distances
    if narrowed.matrix:  # its elements are elements of the kind
        row.check("g", name, narrowed.random(n, g, torch.float64), torch.float64)
    if row.learned is not None:
        basis = mean_free_basis(n) if row.needs_basis else None
        k = torch.zeros(row.free_shape(n), dtype=torch.float64)
        assert torch.allclose(row.learned(k, basis), torch.eye(n, dtype=torch.float64))
        k = torch.randn(row.free_shape(n), generator=g, dtype=torch.float64) / 3
        row.check("g", name, row.learned(k, basis), torch.float64)
    assert row.conditioned == (not row.orthogonal and row.per_head)


@pytest.mark.parametrize("name", MATRIX_KINDS)
def test_each_rows_check_refuses_a_map_of_no_kind_it_holds(name):
    """A check that passed everything would pass the test above."""
    row, n = KINDS[name], 4
    singular = torch.ones(n, n, dtype=torch.float64)
    with pytest.raises(PermutationError, match="'g'"):
        row.check("g", name, singular, torch.float64)


def test_every_matchers_fit_table_covers_the_kinds_it_meets():
    from lmckit.match import activation_transform, orthogonal

    assert set(activation_transform.GROUP_FITS) == set(KINDS)
    per_head = {name for name, row in KINDS.items() if row.per_head}
    assert set(activation_transform.HEAD_SCORES) == per_head
    assert set(activation_transform.HEAD_FITS) == per_head
    assert set(orthogonal.FITS) == {row.narrowed for row in KINDS.values()}


def _rules_before_the_table(f: GroupFacts) -> list[str]:
    """The tracer's hand-written order before the table held it; a pinned group (rotary
    head dimensions, issue 59) tries the rotary kinds only."""
    if f.pinned:
        return (["rotary-scaled"] if f.readers_dual else []) + ["rotary"]
    tries = ["invertible"] if f.readers_dual else []
    tries += ["orthogonal"] if f.heads or not f.layer_norm else []
    if not f.heads and f.size > 2:
        tries.append("orthogonal-mean-free")
    if f.readers_dual and not f.heads:
        tries.append("scaling")
    return tries


def test_the_tracer_tries_the_kinds_its_rules_allowed():
    for size, heads, layer_norm, dual, pinned in itertools.product((2, 3, 8), *[(False, True)] * 4):
        if pinned and not heads:  # a pinned group is head-structured
            continue
        facts = GroupFacts(
            size=size, heads=heads, layer_norm=layer_norm, readers_dual=dual, pinned=pinned
        )
        assert tried_kinds(facts) == _rules_before_the_table(facts), facts


def test_no_module_outside_the_table_compares_kind_names():
    """``kind == "invertible"``, ``kind in ("invertible", "scaling")``: a new kind would
    have to be found in every such place; the table's flags say it once. Fit tables keyed
    by kind (checked complete above) are the one other place names appear."""
    root = Path(__file__).resolve().parents[1] / "src" / "lmckit"
    names = set(KINDS)
    found = []
    for path in root.rglob("*.py"):
        if path.name == "kinds.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            strings = [
                e.value
                for o in operands
                for e in ([o] if not isinstance(o, ast.Tuple | ast.List | ast.Set) else o.elts)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
            if names & set(strings):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []
