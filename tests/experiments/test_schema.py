"""Experiment files: validation that names the key, grid expansion."""

import pytest

from lmckit.experiments.schema import ExperimentError, load_experiment, parse_experiment
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
        ({"compare": [{"lambdas": 1}]}, "compare[0].lambdas must be in [2, 10000]"),
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
            {"paper": [{"step": "curve", "metric": "x", "value": 1, "source": "T", "k": 5}]},
            "paper[0] has unknown key(s) ['k']",
        ),
        (
            {"paper": [{"step": "merge", "metric": "x", "value": 1, "source": "T", "n": 1}]},
            "paper[0].n must be a number of models",
        ),
        (
            {"paper": [{"step": "curve", "metric": "x", "value": 1, "source": "T", "n": 5}]},
            "paper[0].n is the number of models of a merge",
        ),
        (
            {"paper": [{"step": "curve", "metric": "x", "value": 1, "source": "T", "block": -1}]},
            "paper[0].block must be a block index",
        ),
        # options checked against the method's own signature: names, types, ranges
        (
            {"compare": [{"methods": ["ste"], "options": {"ste": {"epoch": 2}}}]},
            "method 'ste' takes no option(s) ['epoch']; its options: epochs,",
        ),
        (
            {"compare": [{"methods": ["ste"], "options": {"ste": {"epochs": True}}}]},
            "compare[0].options.ste: epochs must be an integer ≥ 1, got True",
        ),
        (
            {"compare": [{"methods": ["sinkhorn"], "options": {"sinkhorn": {"epochs": 2}}}]},
            "method 'sinkhorn' takes no option(s) ['epochs']",
        ),
        (
            {"merge": [{"methods": ["star-ste"], "n": [2], "options": {"star-ste": {"lr": "1"}}}]},
            "lr must be a positive number, got '1'",
        ),
        (
            {"merge": [{"methods": ["ccmm"], "n": [2], "options": {"ccmm": {"max_iter": 0}}}]},
            "max_iter must be an integer ≥ 1, got 0",
        ),
        ({"train": {"epochs": True}}, "epochs must be an integer ≥ 1, got True"),
        ({"train": {"lr": "0.1"}}, "lr must be a positive number, got '0.1'"),
        ({"train": {"epoch": 2}}, "unknown training option(s) ['epoch']"),
        ({"train": {"momentum": 0.5}}, "momentum does not apply: the optimizer is adam"),
        ({"train": {"warmup_epochs": 1}}, "warmup_epochs does not apply"),
        (
            {"train": {"split": {"kind": "random", "clients": 2, "alpha": 0.1}}},
            "split kind 'random' takes no alpha",
        ),
        (
            {"train": {"split": {"kind": "class-imbalanced", "fraction": 0}}},
            "split fraction must be in (0, 1)",
        ),
        ({"compare": [{"pairs": [[-1, 0]]}]}, "[-1, 0] holds a negative index"),
        ({"compare": [{"pairs": [[1, 1]]}]}, "[1, 1] pairs a model with itself"),
        ({"compare": [{"pairs": [[0, 1], [0, 1]]}]}, "with repeats"),
        ({"compare": [{"pairs": [[True, 0]]}]}, "must be a list of [i, j] index lists"),
        ({"compare": [{"pairs": []}]}, "must list at least one [i, j]"),
        (
            {"seeds": [0], "compare": [{"pairs": "all", "methods": ["none"]}]},
            "compare[0].pairs = 'all' gives no pair of the 1 seed(s)",
        ),
        ({"compare": [{"lambdas": 10**9}]}, "compare[0].lambdas must be in [2, 10000]"),
        ({"compare": [{"methods": ["none", "wm-fast", "none"]}]}, "lists 'none' more than once"),
        ({"merge": [{"methods": ["average"], "n": [2, 2]}]}, "merge[0].n lists 2 more than once"),
        ({"grid": {"train.epochs": [1, 2, 1]}}, "grid.train.epochs lists 1 more than once"),
        ({"grid": {"model.hidden": [[8], [8]]}}, "grid.model.hidden lists [8] more than once"),
        ({"name": ""}, "name must be a non-empty line of printable text"),
        ({"name": "a\x00b"}, "name must be a non-empty line of printable text"),
        ({"variants": [{"name": " "}]}, "variants[0].name must be a non-empty line"),
        (
            {"grid": {f"train.{k}": list(range(1, 30)) for k in ("epochs", "batch_size", "seed")}},
            "the grid has 24,389 cells (29 × 29 × 29)",
        ),
        (
            {"seeds": list(range(1000)), "compare": [{"pairs": "all", "methods": ["none"]}]},
            "expands into about 1,000,000 jobs",
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
    (tmp_path / "x.toml").write_text('name = "x"\nseeds = 3\n[data]\ndataset = "digits"\n')
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
    from lmckit.experiments.schema import VARIANT_KEY

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


def test_overrides_reach_nested_keys_and_blocks_by_index():
    experiment = load_experiment(
        TINY, {"compare.0.lambdas": 3, "train.split.kind": "random", "train.split.clients": 2}
    )
    assert experiment.compare[0].lambdas == 3
    assert experiment.train["split"] == {"kind": "random", "clients": 2}
    assert experiment.overrides == {
        "compare.0.lambdas": 3, "train.split.kind": "random", "train.split.clients": 2
    }  # fmt: skip
    assert "lambdas = 3" in experiment.as_run() and experiment.as_run().startswith("# lmckit")
    with pytest.raises(ExperimentError, match="compare is a list of blocks; name one"):
        load_experiment(TINY, {"compare.lambdas": 3})
    with pytest.raises(ExperimentError, match=r"\(indices 0..0\); there is no block 5"):
        load_experiment(TINY, {"compare.5.lambdas": 3})
    with pytest.raises(ExperimentError, match=r"by its index, e\.g\. compare\.0\.x\.lambdas"):
        load_experiment(TINY, {"compare.x.lambdas": 3})


def test_a_byte_order_mark_is_read_as_the_text_it_starts(tmp_path):
    (tmp_path / "bom.toml").write_bytes("\ufeff".encode() + TINY.read_bytes())
    assert load_experiment(tmp_path / "bom.toml") == load_experiment(TINY)


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "latin.toml").write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ExperimentError, match=r"latin.toml is not UTF-8 text .*byte 11 is 0xe9"):
        load_experiment(tmp_path / "latin.toml")


def test_model_options_are_typed_once_the_data_is_known(digits):
    from lmckit.experiments.schema import model_configs

    for model, message in (
        ({"name": "mlp", "hidden": "64"}, "hidden must be a list of integers ≥ 1, got '64'"),
        ({"name": "mlp", "hidden": [8], "width_multiplier": 2}, "not both"),
        ({"name": "vgg11", "skip": True}, "vgg11 takes no skip"),
        ({"name": "mlp", "width_multiplier": 1e-4}, "leaves a layer of 512 units with none"),
    ):
        experiment = parse_experiment({**BASE, "model": model})
        with pytest.raises(ExperimentError, match=message):
            model_configs(experiment, lambda _name: digits)


def test_the_annotated_example_names_every_key():
    """The module docstring's annotated file is the experiment reference of the site: every
    key the parser accepts appears in it."""
    from lmckit.experiments import schema as spec

    doc = spec.__doc__
    for keys in (spec.TOP_KEYS, spec.COMPARE_KEYS, spec.MERGE_KEYS, spec.TRIPLET_KEYS,
                 spec.PAPER_KEYS):  # fmt: skip
        missing = [k for k in keys if not any(f in doc for f in (f"{k} =", f"[{k}", f".{k}]"))]
        assert missing == []


def test_fixed_merge_weights_must_fit_every_count_of_their_block():
    """STE-MM's fixed ``weights`` are one number per model: a block that also merges
    another count (or ``"parts"`` resolving to another count) is refused when the file is
    read, naming the count — not when that merge job is reached after all training."""
    block = {"methods": ["ste-mm"], "options": {"ste-mm": {"weights": [0.5, 0.5]}}}
    fits = parse_experiment({**BASE, "seeds": [0, 1, 2], "merge": [{**block, "n": [2]}]})
    assert fits.merge[0].options["ste-mm"]["weights"] == [0.5, 0.5]
    with pytest.raises(ExperimentError, match=r"ste-mm \(n = 3\): fixed weights must be 3 "):
        parse_experiment({**BASE, "seeds": [0, 1, 2], "merge": [{**block, "n": [2, 3]}]})
    split = {"epochs": 1, "split": {"kind": "random", "clients": 3}}
    with pytest.raises(ExperimentError, match=r"\(n = 3\): fixed weights must be 3 "):
        parse_experiment(
            {**BASE, "seeds": [0, 1, 2], "train": split, "merge": [{**block, "n": ["parts"]}]}
        )


def test_overrides_are_read_as_toml_and_each_key_is_given_once():
    from lmckit.experiments.schema import parse_overrides

    assert parse_overrides(["train.epochs=2", "seeds=[0, 1]", "model.name=mlp", "x = 1.5"]) == {
        "train.epochs": 2, "seeds": [0, 1], "model.name": "mlp", "x": 1.5
    }  # fmt: skip
    with pytest.raises(ExperimentError, match=r"train.epochs is given twice \(1, then '2'\)"):
        parse_overrides(["train.epochs=1", "train.epochs=2"])
    with pytest.raises(ExperimentError, match="one lies inside the other"):
        parse_overrides(["train={ epochs = 1 }", "train.epochs=2"])
    for bad in ("epochs", "=3"):
        with pytest.raises(ExperimentError, match="needs key=value"):
            parse_overrides([bad])


def test_an_experiment_file_must_name_itself(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[data]\ndataset = "digits"\n[model]\nname = "mlp"\n')
    with pytest.raises(ExperimentError, match=r'e.toml has no name: add name = "..."'):
        load_experiment(path)
    assert load_experiment(path, {"name": "given"}).name == "given"
    assert parse_experiment(BASE).name == "experiment"  # built in Python: the default
