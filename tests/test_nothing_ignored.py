"""Input the command line used to accept silently: options that do nothing, values that make
no sense, outputs that overwrite inputs or files lmckit did not write, weights that do not
match their sidecar, work too large to finish. Each is one clear line on stderr, with the
exit status the README promises (2: the command line; 1: a command that failed), and no
file is touched."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import save_file

from lmckit.cli import main
from tests.test_cli import digits_mlp_args, unclear_lines, write_bad_input_files


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    root = tmp_path_factory.mktemp("ignored")
    files = write_bad_input_files(root)
    assert main(digits_mlp_args(root, seeds=[2], epochs=1, hidden=[16])) == 0
    files["c"] = str(root / "mlp-digits-seed2.safetensors")
    meta = json.loads((root / "mlp-digits-seed0.json").read_text())
    weights = (root / "mlp-digits-seed0.safetensors").read_bytes()
    # a sidecar whose whole-file digest is not its weights' (its chunk digests are)
    (root / "claims.safetensors").write_bytes(weights)
    (root / "claims.json").write_text(json.dumps({**meta, "weights_sha256": "0" * 64}))
    # a version-1 sidecar kept with weights changed after it was written
    flipped = bytearray(weights)
    flipped[-5] ^= 0xFF
    (root / "old.safetensors").write_bytes(bytes(flipped))
    (root / "old.json").write_text(json.dumps({**meta, "format_version": 1}))
    # a user's plain state dict (for --model-class) and files that are not lmckit's
    from tests.tracing.test_trace import DigitsCNN

    torch.manual_seed(0)
    save_file(DigitsCNN().state_dict(), root / "mine.safetensors")
    torch.save(DigitsCNN().state_dict(), root / "nb.pt")
    (root / "notes.json").write_text('{"mine": true}\n')
    (root / "experiment-folder").mkdir()
    (root / "experiment-folder" / "experiment.toml").write_text("# the user's own file\n")
    (root / "curves-folder").mkdir()
    (root / "curves-folder" / "interpolation.json").write_text("{}\n")
    # an experiment run's folder: its result store holds only the run's artifacts
    (root / "run" / "store" / "checkpoint").mkdir(parents=True)
    (root / "run" / "ledger.sqlite").write_bytes(b"")
    (root / "perm.json").write_text(json.dumps({"format": "lmckit-permutation", "perm": {}}))
    (root / "bad.toml").write_bytes(b'name = "\xff"\n')
    data = root / "partial"
    data.mkdir()
    from lmckit.data import write_idx

    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        shape = (4, 28, 28) if "images" in stem else (4,)
        write_idx(data / stem, torch.zeros(shape, dtype=torch.uint8).numpy())
    files["digests"] = {
        str(p.relative_to(root)): _digest(p) for p in root.rglob("*") if p.is_file()
    }
    return files


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


CNN = "tests.tracing.test_trace:DigitsCNN"


def cases(f):
    """(id, argv, exit status, what the message must say)."""
    r, a, b, c = f["root"], f["a"], f["b"], f["c"]
    m, i, o = str(r / "m"), str(r / "i"), str(r / "p.json")
    store = r / "run" / "store"
    match = ["match", a, b, "--out", o]
    interp = ["interpolate", a, b, "-q", "--out", i, "--lambdas", "3"]
    train = ["train", "--model", "mlp", "--dataset", "digits", "--out", str(r / "t"), "-q"]
    cls = ["--model-class", CNN, "--input-shape", "1", "8", "8"]
    return [
        # options that do nothing
        ("wm-epochs", [*match, "--method", "wm", "--epochs", "5"], 2, "--epochs does not apply"),
        ("am-restarts", [*match, "--method", "am", "--restarts", "3"], 2, "--restarts does not"),
        ("wm-recipe", [*match, "--method", "wm", "--recipe", "paper"], 2, "takes no recipe"),
        (
            "ccmm-recipe",
            ["merge", a, b, "--method", "ccmm", "--recipe", "paper", "--out", m],
            2,
            "recipe",
        ),
        ("sinkhorn-epochs", [*match, "--method", "sinkhorn", "--epochs", "2"], 2, "takes no ep"),
        ("wm-dataset", [*match, "--method", "wm", "--dataset", "digits"], 2, "--dataset does"),
        ("model-args-alone", [*match, "--model-args", "{}"], 2, "--model-args does not apply"),
        ("input-shape-alone", [*match, "--input-shape", "5"], 2, "--input-shape does not apply"),
        ("tokens-alone", [*interp, "--tokens", "5"], 2, "--tokens does not apply"),
        ("perm-and-method", [*interp, "--perm", str(r / "perm.json"), "--method", "wm"], 2, "con"),
        (
            "sweep-and-method",
            ["merge", a, b, "--sweep-n", "2", "--method", "ccmm", "--out", m],
            2,
            "--method does not apply",
        ),
        (
            "sweep-and-landscape",
            ["merge", a, b, c, "--sweep-n", "2..3", "--landscape", "3", "--out", m],
            2,
            "--landscape does not apply",
        ),
        ("landscape-two", ["merge", a, b, "--landscape", "5", "--out", m], 2, "three aligned"),
        ("ccmm-epochs", ["merge", a, b, "--method", "ccmm", "--epochs", "2", "--out", m], 2, "ep"),
        ("bn-batches-no-bn", [*interp, "--bn-batches", "5"], 2, "--bn-batches does not apply"),
        ("hidden-resnet", ["train", "--model", "resnet20", "--hidden", "8", "--out", m], 2, "hid"),
        ("hidden-and-width", [*train, "--hidden", "8", "--width-multiplier", "2"], 2, "--hidden"),
        ("skip-vgg", ["train", "--model", "vgg11", "--skip", "--out", m], 2, "takes no skip"),
        (
            "fraction-random",
            [*train, "--split", "random", "--part", "0", "--fraction", "0.3"],
            2,
            "--fraction does not apply",
        ),
        ("fraction-alone", [*train, "--fraction", "0.3"], 2, "--fraction does not apply"),
        (
            "clients-halves",
            [*train, "--split", "class-imbalanced", "--part", "a", "--clients", "3"],
            2,
            "--clients does not apply",
        ),
        ("momentum-adam", [*train, "--momentum", "0.5"], 2, "momentum does not apply"),
        ("warmup-constant", [*train, "--warmup-epochs", "1"], 2, "warmup_epochs does not apply"),
        (
            "counterexample-gamma",
            ["analyze", "--counterexample", "--gamma", "0.5", "--out", m],
            2,
            "--gamma does not apply",
        ),
        ("no-data-layerwise", ["analyze", a, b, "--no-data", "--layerwise", "--out", m], 2, "lay"),
        ("address-local", ["run", str(r / "bad.toml"), "--out", m, "--address", "x"], 2, "--addr"),
        ("spec-args-ckpt", ["spec", a, "--input-shape", "64", "--model-args", "{}"], 2, "--model"),
        # values that make no sense
        (
            "fraction-zero",
            [*train, "--split", "class-imbalanced", "--part", "a", "--fraction", "0"],
            2,
            "fraction must be in (0, 1)",
        ),
        ("no-units", [*train, "--width-multiplier", "0.0001"], 2, "leaves a layer of 512 units"),
        ("duplicate-seeds", [*train, "--seeds", "0", "0"], 2, "more than once"),
        (
            "diverged",
            [
                *train[:-3],
                "--out",
                str(r / "div"),
                "-q",
                "--hidden",
                "8",
                "--epochs",
                "2",
                "--lr",
                "1e6",
            ],
            1,
            "diverged",
        ),
        ("restarts-huge", [*match, "--restarts", "1000000000"], 2, "would take at least"),
        ("lambdas-huge", [*interp[:-1], "1000000000"], 2, "would take at least"),
        ("landscape-huge", ["merge", a, b, c, "--landscape", "100000", "--out", m], 2, "would"),
        ("landscape-zero", ["merge", a, b, c, "--landscape", "0", "--out", m], 2, "≥ 2, got 0"),
        (
            "seed-on-a-plain-average",
            ["merge", a, b, "--method", "average", "--seed", "3", "--out", m],
            2,
            "--seed does not apply here: average draws nothing",
        ),
        ("probes-huge", ["merge", a, b, "--sharpness-probes", "100000000", "--out", m], 2, "wo"),
        ("model-huge", [*train, "--width-multiplier", "10000"], 2, "of memory"),
        ("ste-epochs-huge", [*match, "--method", "ste", "--epochs", "100000000"], 2, "would take"),
        (
            "demo-ste-epochs-huge",
            ["demo", "--dataset", "digits", "--ste-epochs", "100000000", "--out", str(r / "d")],
            2,
            "match job match/c0/0-1/ste (ste) for 100000000 epoch(s) would take at least",
        ),
        # outputs over inputs or over files lmckit did not write
        (
            "out-plain-input",
            [
                "match",
                str(r / "nb.pt"),
                str(r / "mine.safetensors"),
                *cls,
                "--out",
                str(r / "nb.pt"),
            ],
            2,
            "one of the inputs",
        ),
        (
            "spec-out-sidecar",
            ["spec", a, "--input-shape", "64", "--out", a[:-12] + ".json"],
            2,
            "one of the inputs",
        ),
        ("spec-out-weights", ["spec", a, "--input-shape", "64", "--out", a], 2, "one of the in"),
        (
            "spec-out-foreign",
            ["spec", a, "--input-shape", "64", "--out", str(r / "notes.json")],
            2,
            "is not a file lmckit wrote",
        ),
        (
            "match-out-foreign",
            [*match[:-1], str(r / "notes.json")],
            2,
            "is not a file lmckit wrote",
        ),
        (
            "run-out-foreign",
            [
                "run",
                "experiments/demo.toml",
                "--out",
                str(r / "experiment-folder"),
                "--set",
                "data.dataset=digits",
            ],
            2,
            "was not written by lmckit",
        ),
        (
            "curves-out-foreign",
            [*interp[:4], "--out", str(r / "curves-folder"), "--lambdas", "3"],
            2,
            "was not written by lmckit",
        ),
        ("spec-shape-huge", ["spec", a, "--input-shape", str(10**20)], 2, "of memory"),
        ("sweep-huge", ["merge", a, b, "--sweep-n", str(10**12), "--out", m], 2, "at most"),
        ("threads-huge", [*train, "--threads", "99999"], 2, "--threads"),
        ("out-empty", [*interp[:4], "--out", "", "--lambdas", "3"], 2, "output path is empty"),
        ("spec-folder", ["spec", str(r), "--input-shape", "64"], 2, "is a folder"),
        ("match-folder", ["match", str(r), b, "--out", o], 2, "is a folder, not a checkpoint"),
        (
            "class-hidden-str",
            [
                "spec",
                "lmckit.models.mlp:MLP",
                "--input-shape",
                "64",
                "--model-args",
                '{"in_dim": 64, "hidden": "16"}',
            ],
            2,
            "hidden must be a list of integers",
        ),
        (
            "augment-vectors",
            ["train", "--model", "mlp", "--dataset", "synthetic", "--augment", "--out", m],
            2,
            "augment does not apply: synthetic holds no images",
        ),
        ("gamma-twice", ["analyze", a, b, "--gamma", "0.3", "0.3", "--out", m], 2, "more than"),
        ("method-twice", [*interp, "--method", "wm", "wm"], 2, "--method lists ['wm'] more than"),
        # integrity and the same model twice
        ("sidecar-digest", ["match", str(r / "claims.json"), b, "--out", o], 1, "records 0000"),
        ("v1-flipped", ["match", str(r / "old.json"), b, "--out", o], 1, "old.safetensors"),
        ("same-twice", ["match", a, a, "--out", o], 2, "given twice"),
        (
            "same-other-spelling",
            ["analyze", a, str(r / ".." / r.name / "mlp-digits-seed0.json"), "--out", m],
            2,
            "given twice",
        ),
        # tracebacks that were
        ("shape-misfit-spec", ["spec", a, "--input-shape", "3", "5"], 2, "do not fit MLP"),
        (
            "shape-misfit-match",
            [
                "match",
                str(r / "mine.safetensors"),
                str(r / "nb.pt"),
                "--model-class",
                CNN,
                "--input-shape",
                "3",
                "5",
                "--out",
                o,
            ],
            2,
            "do not fit",
        ),
        ("toml-not-utf8", ["run", str(r / "bad.toml"), "--out", m], 2, "not UTF-8"),
        *(
            (f"into-a-store-{argv[0]}", argv, 2, "inside the result store of the run in")
            for argv in (
                ["train", "--model", "mlp", "--dataset", "digits", "--out", str(store / "t")],
                ["match", a, b, "--out", str(store / "p.json")],
                ["interpolate", a, b, "-q", "--out", str(store / "i")],
                ["merge", a, b, "--out", str(store)],
                ["analyze", a, b, "--no-data", "--out", str(store / "checkpoint" / "x")],
                ["spec", a, "--input-shape", "64", "--out", str(store / "s.json")],
                ["demo", "--out", str(store / "d")],
            )
        ),
        (
            "data-dir-partial",
            [*interp, "--dataset", "fashion-mnist", "--data-dir", str(r / "partial")],
            1,
            "t10k-images-idx3-ubyte",
        ),
    ]


def test_every_input_that_was_ignored_is_one_clear_line_and_touches_nothing(f, capsys):
    failures = unclear_lines(cases(f), capsys)
    assert not failures, "\n".join(failures)
    root = f["root"]
    after = {str(p.relative_to(root)): _digest(p) for p in root.rglob("*") if p.is_file()}
    changed = [n for n, d in f["digests"].items() if after.get(n) != d]
    assert not changed, changed
    for folder in ("t", "i", "m", "d"):
        assert not (root / folder).exists(), folder
    assert [p.name for p in (root / "run" / "store").iterdir()] == ["checkpoint"]
    assert not any((root / "run" / "store" / "checkpoint").iterdir())
    # the diverged run wrote no checkpoint, only its last good state, named as such
    assert sorted(p.name for p in (root / "div").glob("*.safetensors")) == [
        "mlp-digits-seed0-last-good.safetensors"
    ]
