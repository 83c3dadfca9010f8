"""Experiment files: validation that names the key, grid expansion."""

import pytest

from lmckit.experiments.spec import ExperimentError, load_experiment, parse_experiment
from tests.experiments.conftest import TINY

BASE = {"data": {"dataset": "digits"}, "model": {"name": "mlp"}}


def test_the_tiny_file_expands_into_cells():
    experiment = load_experiment(TINY)
    cells = experiment.cells()
    assert [c["model"]["hidden"] for c in cells] == [[16, 16], [32, 32]]
    assert cells[0]["values"] == {"model.hidden": [16, 16]}
    assert experiment.compare[0].pair_list(3) == [(0, 1), (0, 2), (1, 2)]
    assert experiment.seeds == (0, 1, 2) and experiment.threads == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "blue"}, "unknown top-level key(s) ['colour']"),
        ({"seeds": "0, 1"}, "seeds must be a list"),
        ({"seeds": [0, 0]}, "seeds must be distinct"),
        ({"threads": 0}, "threads must be at least 1"),
        ({"data": {}}, "data.dataset must be a string"),
        ({"model": {"name": 3}}, "model.name must be a string"),
        ({"model": {"name": "alexnet"}}, "unknown model 'alexnet'"),
        ({"model": {"name": "mlp", "depth": 3}}, "unknown model option(s) ['depth']"),
        ({"train": {"epochs": 0}}, "epochs must be"),
        ({"grid": {"hidden": [[8]]}}, "grid key 'hidden' must be \"model.<option>\""),
        ({"grid": {"model.hidden": []}}, "grid.model.hidden must list at least one value"),
        ({"compare": [{"methods": ["magic"]}]}, "compare[0].methods: unknown method 'magic'"),
        ({"compare": [{"pairs": "some"}]}, 'compare[0].pairs must be "all", "first"'),
        ({"compare": [{"lambdas": 1}]}, "compare[0].lambdas must be at least 2"),
        ({"compare": [{"lambdas": "25"}]}, "compare[0].lambdas must be an integer"),
        ({"compare": [{"splits": {"val": "all"}}]}, "compare[0].splits has unknown key(s)"),
        ({"compare": [{"splits": {"test": -1}}]}, "compare[0].splits.test must be"),
        ({"compare": [{"pairs": [[0, 5]]}]}, "pairs index 5 but only 2 seeds"),
        ({"compare": [{"options": {"ste": {}}}]}, "the block does not use method 'ste'"),
        ({"compare": [{"colour": 1}]}, "compare[0] has unknown key(s) ['colour']"),
        ({"merge": [{"methods": ["star-wm"], "n": [1]}]}, "merge[0].n must list model counts"),
        ({"merge": [{"methods": ["star-wm"], "n": [3]}]}, "asks for 3 models; 2 seeds"),
        ({"merge": [{"methods": "star-wm", "n": [2]}]}, "merge[0].methods must be a list"),
        ({"compare": [{"analyses": ["svd"]}]}, "compare[0].analyses: unknown analysis ['svd']"),
        ({"compare": [{"analyses": [["taylor"]]}]}, "compare[0].analyses[] must be a string"),
        ({"compare": [{"splits": {}}]}, "compare[0].splits must name at least one split"),
        ({"triplets": [{"methods": ["wm-fast"]}]}, "triplets[0] needs at least three seeds"),
        ({"seeds": [0, 1, 2], "triplets": [{"triples": [[0, 1, 3]]}]}, "beyond the 3 seeds"),
        ({"seeds": [0, 1, 2], "triplets": [{"triples": "all"}]}, 'must be "disjoint"'),
        ({"seeds": [0, 1, 2], "triplets": [{"gamma": 1}]}, "triplets[0].gamma must be a number"),
        ({"seeds": [0, 1, 2], "triplets": [{"methods": ["none"]}]}, "unknown method 'none'"),
        ({"spectra": "yes"}, "spectra must be true or false"),
        ({"variants": [{"train.lr": 0.1}]}, "variants[0].name must be"),
        ({"variants": [{"name": "a", "lr": 0.1}]}, 'key \'lr\' must be "name", "model.<option>"'),
        ({"variants": [{"name": "a"}, {"name": "a"}]}, "variants need distinct names"),
        (
            {"variants": [{"name": "a", "train.lr": {"x": 1}}]},
            "variants[0].train.lr must be a single",
        ),
        ({"variants": [{"name": "a", "model.depth": 3}]}, "unknown model option(s) ['depth']"),
        ({"paper": [{"step": "curve", "metric": "x", "source": "T1"}]}, "paper[0].value must be"),
        ({"paper": [{"step": "curve", "value": 1, "source": "T1"}]}, "paper[0].metric must be"),
        (
            {"paper": [{"step": "curve", "metric": "x", "value": 1, "source": "T", "n": 5}]},
            "paper[0] has unknown key(s) ['n']",
        ),
    ],
)
def test_bad_files_name_the_key_and_what_it_expected(change, message):
    with pytest.raises(ExperimentError) as exc:
        parse_experiment({**BASE, **change})
    assert message in str(exc.value)


def test_file_errors_name_the_file(tmp_path):
    (tmp_path / "bad.toml").write_text("name = [")
    with pytest.raises(ExperimentError, match=r"bad.toml is not valid TOML"):
        load_experiment(tmp_path / "bad.toml")
    with pytest.raises(ExperimentError, match="cannot read experiment file"):
        load_experiment(tmp_path / "none.toml")
    (tmp_path / "x.toml").write_text('seeds = 3\n[data]\ndataset = "digits"\n')
    with pytest.raises(ExperimentError, match=r"x.toml: seeds must be a list, got 3"):
        load_experiment(tmp_path / "x.toml")


def test_overrides_replace_values():
    experiment = load_experiment(TINY, {"train.epochs": 1, "data.dataset": "synthetic"})
    assert experiment.train["epochs"] == 1 and experiment.dataset == "synthetic"


def test_every_experiment_file_in_the_repository_is_valid():
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.toml"))
    assert len(files) >= 6
    for path in files:
        experiment = load_experiment(path)
        assert experiment.description and experiment.expected_runtime, path


def test_variants_are_crossed_with_the_grid(tmp_path):
    from lmckit.experiments.spec import VARIANT_KEY

    path = tmp_path / "v.toml"
    path.write_text(
        'name = "v"\nseeds = [0, 1]\n[data]\ndataset = "digits"\n[model]\nname = "mlp"\n'
        '[train]\nepochs = 4\n[grid]\n"model.width_multiplier" = [1, 2]\n'
        '[[variants]]\nname = "base"\n[[variants]]\nname = "fast"\n"train.lr" = 0.01\n'
        '"train.epochs" = 2\n'
    )
    cells = load_experiment(path).cells()
    assert [(c["values"][VARIANT_KEY], c["values"]["model.width_multiplier"]) for c in cells] == [
        ("base", 1),
        ("base", 2),
        ("fast", 1),
        ("fast", 2),
    ]
    assert cells[0]["train"] == {"epochs": 4}
    assert cells[3]["train"] == {"epochs": 2, "lr": 0.01}
    assert cells[3]["model"] == {"name": "mlp", "width_multiplier": 2}
