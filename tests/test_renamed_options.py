"""Renamed keyword options kept for one release (``variant=`` → ``recipe=``): the old name
reaches the same code as the new one — from Python, the method registry, an experiment file
and the command line — with a warning, never as a second, silently different option."""

import inspect
import warnings

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.match import METHODS as MATCHERS
from lmckit.match import sinkhorn_matching
from lmckit.merge import METHODS as MERGERS
from lmckit.options import RENAMED_OPTIONS
from tests.zoo import planted


@pytest.fixture(scope="module")
def pair():
    _, spec, a, b, _ = planted("mlp", {"in_dim": 16, "hidden": [12, 10]})
    g = torch.Generator().manual_seed(1)
    b = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in b.items()}
    return spec, a, b


def test_the_old_name_runs_the_new_option_and_warns(pair):
    spec, a, b = pair
    new = sinkhorn_matching(spec, a, b, steps=15, lr=0.3, seed=2, recipe="paper")
    default = sinkhorn_matching(spec, a, b, steps=15, lr=0.3, seed=2)
    with pytest.warns(DeprecationWarning, match="variant= is now recipe="):
        old = sinkhorn_matching(spec, a, b, steps=15, lr=0.3, seed=2, variant="paper")
    assert old.info["recipe"] == "paper"
    assert old.history == new.history
    assert old.history != default.history  # the two recipes differ, so the test can fail


def test_both_names_at_once_are_refused(pair):
    spec, a, b = pair
    with pytest.raises(ParamsError, match="variant= and recipe= both given"):
        sinkhorn_matching(spec, a, b, recipe="paper", variant="lmckit")


def test_a_bad_value_under_the_old_name_is_named_by_the_new_one(pair):
    spec, a, b = pair
    with pytest.warns(DeprecationWarning), pytest.raises(ParamsError, match="recipe must be"):
        sinkhorn_matching(spec, a, b, variant="Paper")


def test_no_signature_or_registry_entry_offers_an_old_name():
    for registry in (MATCHERS, MERGERS):
        for name, method in registry.items():
            params = inspect.signature(method.fn).parameters
            assert not set(RENAMED_OPTIONS) & set(params), name
            assert not set(RENAMED_OPTIONS) & set(method.options()), name
    takes = {o for m in (*MATCHERS.values(), *MERGERS.values()) for o in m.options()}
    assert set(RENAMED_OPTIONS.values()) <= takes  # each new name is a real option


def test_the_registry_returns_options_under_their_new_names():
    with pytest.warns(DeprecationWarning):
        options = MERGERS["ste-mm"].check_options({"variant": "paper", "epochs": 2})
    assert options == {"recipe": "paper", "epochs": 2}
    # a combination check sees the renamed option (Alg. 1 draws its own weights)
    with pytest.warns(DeprecationWarning), pytest.raises(ParamsError, match="fixed weights"):
        MERGERS["ste-mm"].check_options({"variant": "paper", "weights": [1, 2]})
    # a method that has no such option still refuses the old name as unknown
    with pytest.raises(ParamsError, match="takes no option"):
        MATCHERS["wm"].check_options({"variant": "paper"})


def test_an_experiment_file_with_the_old_name_keys_its_jobs_by_the_new(tmp_path):
    from lmckit.experiments.schema import load_experiment

    def experiment(option: str):
        path = tmp_path / f"{option}.toml"
        path.write_text(
            'name = "x"\nseeds = [0, 1]\n[data]\ndataset = "digits"\n[model]\nname = "mlp"\n'
            '[train]\nepochs = 1\n[[compare]]\nmethods = ["ste"]\n'
            f'[compare.options]\nste = {{ epochs = 1, {option} = "paper" }}\n'
        )
        return load_experiment(path)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = experiment("recipe")
    with pytest.warns(DeprecationWarning):
        old = experiment("variant")
    wanted = {"ste": {"epochs": 1, "recipe": "paper"}}
    assert old.compare[0].options == new.compare[0].options == wanted


def test_the_old_flag_sets_the_new_option_and_says_so(capsys, tmp_path):
    from lmckit.cli import build_parser, given_options

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"")
    b.write_bytes(b"")
    argv = ["match", str(a), str(b), "--method", "ste", "--variant", "paper"]
    given = given_options(argv)
    assert capsys.readouterr().err == ""  # the parse that finds the given options is quiet
    args = build_parser().parse_args(argv)
    assert args.recipe == "paper" and not hasattr(args, "variant")
    assert "recipe" in given
    assert "--variant is now --recipe" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["match", "--help"])
    shown = capsys.readouterr().out
    assert "--recipe" in shown and "--variant" not in shown


@pytest.mark.parametrize(
    "flags",
    [["--recipe", "paper", "--variant", "lmckit"], ["--variant", "lmckit", "--recipe", "paper"],
     ["--recipe", "paper", "--recipe", "lmckit"]],
)  # fmt: skip
def test_the_switch_given_twice_is_refused_not_the_last_kept(flags, capsys, tmp_path):
    from lmckit.cli import build_parser

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"")
    b.write_bytes(b"")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["match", str(a), str(b), "--method", "ste", *flags])
    assert "sets --recipe, which is already given" in capsys.readouterr().err
