"""Method registries: every method listed once, with truthful needs and options."""

import inspect

import pytest

import lmckit.match
import lmckit.merge
from lmckit.errors import ParamsError
from lmckit.match import METHODS as MATCHERS
from lmckit.match import TRANSFORM_METHODS
from lmckit.merge import METHODS as MERGERS
from lmckit.transform import align
from tests.merge.common import planted_copies, transformer_models


def public_functions(module, suffix):
    return {
        getattr(module, name)
        for name in module.__all__
        if inspect.isfunction(getattr(module, name)) and name.endswith(suffix)
    }


def test_every_public_matcher_and_merger_is_registered_with_one_signature():
    assert {m.fn for m in MATCHERS.values()} == public_functions(lmckit.match, "_matching") - {
        lmckit.match.weight_matching_reference
    }
    assert {m.fn for m in MERGERS.values()} == {
        lmckit.merge.average,  # uniform and size-weighted (FedAvg)
        lmckit.merge.star,
        lmckit.merge.merge_many,
        lmckit.merge.merge_many_orthogonal,
        lmckit.merge.ste_mm,
        lmckit.merge.ccmm,
    }
    for family in (MATCHERS, MERGERS):  # the signature itself: the protocol test below
        for method in family.values():
            assert method.summary and set(method.fixed) <= set(
                inspect.signature(method.fn).parameters
            )


@pytest.mark.parametrize("name", list(MATCHERS))
def test_matchers_need_what_the_registry_says(name, digits):
    model, spec, base, copies = planted_copies(2)
    if name in TRANSFORM_METHODS:  # maps beyond permutations: a transformer (MLPs refuse)
        model, spec, copies, digits = transformer_models(2)
        base = copies[0]
    method = MATCHERS[name]
    if method.needs_model or method.needs_data:
        with pytest.raises(ParamsError, match="needs"):
            method.fn(spec, copies[0], copies[1], **method.fixed)
    else:
        method.fn(spec, copies[0], copies[1], **method.fixed)
    options = {"epochs": 1} if "epochs" in method.options() else {}
    data = digits if method.needs_data or name in TRANSFORM_METHODS else None
    result = method(spec, copies[0], copies[1], model=model, data=data, **options)
    assert align(result.perm, copies[1]).keys() == base.keys()
    if method.fixed:
        with pytest.raises(ParamsError, match="fixes"):
            method(spec, copies[0], copies[1], model=model, data=data, **method.fixed)
    if method.fn.__name__ == "weight_matching":  # WM reads no data: given some, it says so
        with pytest.raises(ParamsError, match="takes no data"):
            method(spec, copies[0], copies[1], data=digits)


@pytest.mark.parametrize("name", list(MERGERS))
def test_mergers_need_what_the_registry_says(name):
    _, spec, _, copies = planted_copies(2)
    method = MERGERS[name]
    if method.needs_model or method.needs_data or method.needs_sizes:
        with pytest.raises(ParamsError, match="needs"):
            method(spec, copies)
    else:
        assert len(method(spec, copies).perms) == 2


def test_options_that_do_nothing_are_refused_and_typed_ones_checked():
    """Sinkhorn on the weight distance runs no epochs over data: offering ``epochs`` would
    be an option that does nothing. Star-STE takes STE's options (it hands them on)."""
    assert "epochs" not in MATCHERS["sinkhorn"].options()
    assert "steps" not in MATCHERS["sinkhorn-mid"].options()
    assert {"epochs", "lr", "batch_size"} <= set(MERGERS["star-ste"].options())
    assert "restarts" in MERGERS["star-wm"].options()
    _, spec, _, copies = planted_copies(2)
    with pytest.raises(ParamsError, match=r"does not use \['epochs'\]"):
        MATCHERS["sinkhorn"](spec, copies[0], copies[1], epochs=2)
    with pytest.raises(ParamsError, match=r"takes no option\(s\) \['epochs'\]"):
        MATCHERS["wm"].check_options({"epochs": 2})
    with pytest.raises(ParamsError, match="epochs must be an integer ≥ 1, got True"):
        MERGERS["star-ste"].check_options({"epochs": True})
    with pytest.raises(ParamsError, match="lr must be a positive number, got '1e-3'"):
        MATCHERS["ste"].check_options({"lr": "1e-3"})
    with pytest.raises(ParamsError, match="lap_backend must be one of"):
        MATCHERS["wm-fast"].check_options({"lap_backend": "hungarian"})
    assert MERGERS["ste-mm"].check_options({"epochs": 2, "weights": [0.5, 0.5]})


@pytest.mark.parametrize(
    ("family", "name", "options", "message"),
    [
        ("match", "ste", {"recipe": "Paper"}, "recipe must be one of 'lmckit', 'paper'"),
        ("match", "sinkhorn-mid", {"recipe": "alg1"}, "recipe must be one of"),
        ("merge", "ste-mm", {"recipe": "Paper"}, "recipe must be one of"),
        ("merge", "ste-mm", {"weights": "uniform"}, "weights must be one of 'dirichlet'"),
        ("merge", "ste-mm", {"recipe": "paper", "weights": [1, 2]}, "fixed weights=.1, 2. do"),
    ],
)
def test_choices_and_combinations_are_refused_before_a_run(family, name, options, message):
    """An option's misspelt choice, or two options that exclude each other, are refused by
    ``check_options`` — what experiment files and the command line call before any job —
    not first by the function when a job reaches it hours later."""
    registry = MATCHERS if family == "match" else MERGERS
    with pytest.raises(ParamsError, match=message):
        registry[name].check_options(options)
    fixed = {k: ("paper" if k == "recipe" else "normalized_uniform") for k in options}
    assert registry[name].check_options(fixed) == fixed


def test_the_symmetry_matchers_choices_are_typed():
    """``symmetry_matching``'s ``symmetries`` and ``start`` are checked as choices at the
    call, before any matching."""
    _, spec, _, copies = planted_copies(2)
    with pytest.raises(ParamsError, match="symmetries must be one of 'orth', 'full', got 'all'"):
        lmckit.match.symmetry_matching(spec, copies[0], copies[1], symmetries="all")


def test_options_are_the_methods_own_keywords():
    assert "restarts" in MATCHERS["wm"].options() and "warm_start" not in MATCHERS["wm"].options()
    assert "epochs" in MATCHERS["ste"].options() and "seed" not in MATCHERS["ste"].options()
    assert "objective" not in MATCHERS["sinkhorn-mid"].options()
    assert "weights" in MERGERS["ste-mm"].options()


def test_every_registered_method_has_its_familys_signature():
    """The family signature is written once (`lmckit.match.Matcher`, `lmckit.merge.Merger`) and
    every registered function fits it; a function that departs from it is named with how."""
    from lmckit.match import METHODS as MATCHERS
    from lmckit.match import Matcher
    from lmckit.merge import METHODS as MERGERS
    from lmckit.merge import Merger
    from lmckit.registry import signature_mismatches

    for protocol, registry in ((Matcher, MATCHERS), (Merger, MERGERS)):
        misfits = {name: signature_mismatches(m.fn, protocol) for name, m in registry.items()}
        assert {name: why for name, why in misfits.items() if why} == {}

    def renamed(spec, a, b, *, model=None, data=None, init=None, seed=1, progress=None):
        return None

    assert signature_mismatches(renamed, Matcher) == [
        "positional parameters ['spec', 'a', 'b'], wanted ['spec', 'params_a', 'params_b']",
        "'seed' defaults to 1, wanted 0",
        "returns nothing declared, wanted MatchResult",
    ]
    from lmckit.merge import average

    assert signature_mismatches(average, Matcher)  # a merger is not a matcher
