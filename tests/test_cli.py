import subprocess
import sys

import pytest
import torch

from lmckit.cli import main


def digits_mlp_args(out, *, seeds, epochs, hidden):
    """`lmckit train` arguments for small MLPs on the bundled digits."""
    return [
        "train",
        "--model",
        "mlp",
        "--dataset",
        "digits",
        "--seeds",
        *map(str, seeds),
        "--epochs",
        str(epochs),
        "--hidden",
        *map(str, hidden),
        "--out",
        str(out),
        "-q",
    ]


def test_info_prints_symmetry_counts(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("mlp(784-512-512-512-10)"))
    assert line.split()[-1] == "3499.62"
    assert "resnet20(width_multiplier=16)" in out


def test_help_and_unknown_command(capsys):
    assert main(["info", "--verbose"]) == 0
    assert main(["--help"]) == 0
    assert "COMMAND" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'frobnicate'" in err


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "lmckit.cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("lmckit ")


def test_train_command_trains_then_skips(tmp_path, capsys):
    args = digits_mlp_args(tmp_path, seeds=[0, 1], epochs=2, hidden=[32, 32])
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "seed 0: train acc" in out and "trained in" in out
    assert (tmp_path / "mlp-digits-seed1.safetensors").exists()
    assert main(args) == 0
    assert capsys.readouterr().out.count("exists, skipped") == 2


def test_train_command_errors_are_clear(tmp_path, capsys):
    assert main(["train", "--model", "alexnet", "--dataset", "digits", "--out", str(tmp_path)]) == 2
    assert "unknown model 'alexnet'" in capsys.readouterr().err
    assert (
        main(["train", "--model", "vgg11", "--dataset", "synthetic", "--out", str(tmp_path)]) == 2
    )
    assert "needs image data" in capsys.readouterr().err


def test_match_command_writes_a_loadable_permutation(tmp_path, capsys):
    from lmckit.checkpoint import load_checkpoint
    from lmckit.params import params_distance
    from lmckit.workflows.matching import load_permutation

    train = digits_mlp_args(tmp_path, seeds=[0, 1], epochs=1, hidden=[32, 32])
    assert main(train) == 0
    a, b = (tmp_path / f"mlp-digits-seed{s}.safetensors" for s in (0, 1))
    for method in ("wm", "wm-fast", "am", "ste", "sinkhorn", "sinkhorn-mid"):
        out = tmp_path / f"{method}.json"
        assert main(["match", str(a), str(b), "--method", method, "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert "L2 distance" in printed
        ca, cb = load_checkpoint(a), load_checkpoint(b)
        perm = load_permutation(out, ca.spec)
        assert params_distance(ca.params, perm.apply(cb.params)) < params_distance(
            ca.params, cb.params
        )
    assert main(["match", str(a), str(tmp_path / "nope.safetensors")]) == 2
    assert "not found" in capsys.readouterr().err


def test_interpolate_command_writes_curves_and_plots(tmp_path, capsys):
    import json

    train = digits_mlp_args(tmp_path, seeds=[0, 1], epochs=3, hidden=[32, 32])
    assert main(train) == 0
    a, b = (str(tmp_path / f"mlp-digits-seed{s}.safetensors") for s in (0, 1))
    out = tmp_path / "interp"
    assert (
        main(
            [
                "interpolate",
                a,
                b,
                "--method",
                "none",
                "wm-fast",
                "--out",
                str(out),
                "--lambdas",
                "5",
                "--calibrated",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "naive" in printed and "wm-fast" in printed
    for name in (
        "interpolation.png",
        "interpolation.json",
        "interpolation.csv",
        "barriers.png",
        "barriers.json",
        "perm-wm-fast.json",
    ):
        assert (out / name).exists(), name
    repaired = ["interpolate", a, b, "--method", "wm-fast", "--repair", "--lambdas", "3"]
    assert main([*repaired, "--test-only", "--out", str(tmp_path / "repaired")]) == 0
    assert (
        main(
            [
                "interpolate",
                a,
                b,
                "--perm",
                str(out / "perm-wm-fast.json"),
                "--out",
                str(tmp_path / "again"),
                "--lambdas",
                "3",
                "--test-only",
            ]
        )
        == 0
    )
    # the permutation file names the pair it aligns; a second call into the folder with
    # another method leaves no permutation file of the first (formerly it stayed, unnamed)
    assert {k: json.loads((out / "perm-wm-fast.json").read_text())[k] for k in "ab"} == {
        "a": a,
        "b": b,
    }
    capsys.readouterr()
    again = ["interpolate", a, b, "--method", "wm", "--lambdas", "3", "--test-only", "-q"]
    assert main([*again, "--out", str(out)]) == 0
    assert f"removed from {out} what an earlier run wrote" in capsys.readouterr().out
    assert not (out / "perm-wm-fast.json").exists() and (out / "perm-wm.json").exists()
    assert list(json.loads((out / "interpolation.json").read_text())) == ["wm"]
    given = ["interpolate", a, b, "--perm", str(out / "perm-wm.json"), "--lambdas", "3", "-q"]
    assert main([*given, "--test-only", "--out", str(out)]) == 0
    assert (out / "perm-wm.json").exists()  # read by this call: kept


def test_analyze_command_writes_measurements_and_figures(tmp_path, capsys):
    import json

    train = digits_mlp_args(tmp_path, seeds=[0, 1], epochs=3, hidden=[32, 32])
    assert main(train) == 0
    a, b = (str(tmp_path / f"mlp-digits-seed{s}.safetensors") for s in (0, 1))
    out = tmp_path / "analysis"
    argv = ["analyze", a, b, "--method", "none", "wm-fast", "--gamma", "0", "0.3", "--out"]
    assert main([*argv, str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "R(γ=0.3)" in printed and "wm-fast" in printed
    summary = json.loads((out / "analysis.json").read_text())
    naive, wm = summary["results"]["naive"], summary["results"]["wm-fast"]
    assert wm["distances"]["parameters"][1] < naive["distances"]["parameters"][1]
    assert wm["R"]["0.3"]["total"] > naive["R"]["0.3"]["total"]
    assert wm["taylor"]["lambdas"] == [0.1, 0.25, 0.5, 0.75, 0.9]
    for name in (
        "spectra.png",
        "alignment.png",
        "alignment-merged.png",
        "distances.png",
        "cosines-wm-fast.png",
        "taylor.png",
        "perm-wm-fast.json",
    ):
        assert (out / name).stat().st_size > 0, name
    perm = ["analyze", a, b, "--perm", str(out / "perm-wm-fast.json"), "--no-data"]
    assert main([*perm, "--out", str(tmp_path / "given")]) == 0
    given = json.loads((tmp_path / "given" / "analysis.json").read_text())["results"]["given"]
    assert given["R"] == wm["R"] and "taylor" not in given
    # into its own folder: the earlier call's heat map and Taylor plot go (this one draws
    # neither), the permutation file it reads stays
    assert main([*perm, "--out", str(out)]) == 0
    assert (out / "perm-wm-fast.json").exists()
    assert not (out / "cosines-wm-fast.png").exists() and not (out / "taylor.png").exists()


def test_analyze_layerwise_writes_the_width_study_diagnostics(tmp_path, capsys):
    import json

    train = digits_mlp_args(tmp_path, seeds=[0, 1], epochs=2, hidden=[32, 32])
    assert main([*train, "--lr", "0.01"]) == 0
    a, b = (str(tmp_path / f"mlp-digits-seed{s}.safetensors") for s in (0, 1))
    out = tmp_path / "lw"
    argv = ["analyze", a, b, "--method", "none", "wm-fast", "--no-taylor", "--layerwise"]
    assert main([*argv, "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "layerwise at λ=½, wm-fast" in printed and "random0" in printed
    lw = json.loads((out / "layerwise.json").read_text())
    assert lw["given"] == "wm-fast"
    naive, wm = (lw["methods"][k]["layerwise"]["layers"] for k in ("naive", "wm-fast"))
    assert [r["name"] for r in naive] == ["layer1", "layer2", "logits"]
    # WM brings the models together: their activations agree more, and they commute better.
    assert wm[1]["activation_cosine"] > naive[1]["activation_cosine"]
    assert wm[1]["commutativity"] < naive[1]["commutativity"]
    merges = lw["random_permutations"]["merges"]
    assert set(merges) == {"none", "given", *(f"random{i}" for i in range(5))}
    assert merges["given"]["accuracy"] > merges["none"]["accuracy"]
    for name in (
        "layerwise.png",
        "moments-naive.png",
        "moments-wm-fast.png",
        "flatness.png",
        "random-permutations.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert main(["analyze", a, b, "--layerwise", "--no-data", "--out", str(tmp_path / "x")]) == 2
    assert "--layerwise does not apply here" in capsys.readouterr().err


def test_analyze_counterexample(tmp_path, capsys):
    import json

    assert main(["analyze", "--counterexample", "--out", str(tmp_path)]) == 0
    assert "lowest barrier over all 4 permutations" in capsys.readouterr().out
    summary = json.loads((tmp_path / "counterexample.json").read_text())
    assert summary["train_error"] == {"a": 0.0, "b": 0.0} and min(summary["barriers"]) > 0.05
    assert (tmp_path / "counterexample.png").stat().st_size > 0


def test_merge_command_and_sweep(tmp_path, capsys):
    import json

    train = digits_mlp_args(tmp_path, seeds=[0, 1, 2], epochs=3, hidden=[24, 24])
    assert main(train) == 0
    ckpts = [str(tmp_path / f"mlp-digits-seed{s}.safetensors") for s in range(3)]
    out = tmp_path / "merged"
    assert (
        main(
            [
                "merge",
                *ckpts,
                "--method",
                "merge-many",
                "--out",
                str(out),
                "--sharpness-probes",
                "3",
                "--landscape",
                "3",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "merged test accuracy" in printed and "sharpness" in printed
    for name in (
        "merged.safetensors",
        "merged.json",
        "permutations.json",
        "metrics.json",
        "geometry.png",
        "landscape.png",
        "landscape.json",
    ):
        assert (out / name).exists(), name
    from lmckit.checkpoint import load_checkpoint

    merged = load_checkpoint(out / "merged.safetensors")
    assert merged.meta["merge_method"] == "merge-many"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n"] == 3 and "sharpness_merged" in metrics
    # merged again without a landscape: the earlier merge's plane is not left beside it
    assert main(["merge", *ckpts, "--method", "star-wm", "--out", str(out)]) == 0
    assert "landscape.json, landscape.png" in capsys.readouterr().out
    assert not (out / "landscape.json").exists() and not (out / "landscape.png").exists()
    sweep = tmp_path / "sweep"
    args = [
        "merge",
        *ckpts,
        "--sweep-n",
        "2..3",
        "--methods",
        "star-wm",
        "ccmm",
        "ste-mm",
        "--epochs",
        "1",
        "--out",
        str(sweep),
    ]
    assert main(args) == 0
    assert (sweep / "sweep.png").exists() and (sweep / "sweep.json").exists()
    assert len(list((sweep / "sweep").glob("*.json"))) == 6
    assert main(args) == 0
    assert capsys.readouterr().out.count("stored result reused") == 6
    at = args.index("2..3")
    assert main([*args[:at], "2..2", *args[at + 1 :]]) == 0  # n = 2 only: n = 3's files go
    assert sorted(p.name for p in (sweep / "sweep").iterdir()) == [
        f"{m}-n2.json" for m in ("ccmm", "star-wm", "ste-mm")
    ]
    assert main(["merge", ckpts[0], "--out", str(tmp_path / "x")]) == 2


def test_interpolate_and_merge_batchnorm_models(tmp_path, capsys):
    """Conv nets with BatchNorm: 28×28-style padding, BN reset on the path, merged BN reset."""
    args = [
        "train",
        "--model",
        "resnet20",
        "--dataset",
        "digits",
        "--seeds",
        "0",
        "1",
        "--epochs",
        "1",
        "--width-multiplier",
        "0.25",
        "--lr",
        "0.05",
        "--out",
        str(tmp_path),
        "-q",
    ]
    assert main(args) == 0
    a, b = (str(tmp_path / f"resnet20-digits-seed{s}.safetensors") for s in (0, 1))
    assert (
        main(
            [
                "interpolate",
                a,
                b,
                "--method",
                "none",
                "wm-fast",
                "--lambdas",
                "3",
                "--test-only",
                "--bn-batches",
                "2",
                "--out",
                str(tmp_path / "i"),
            ]
        )
        == 0
    )
    import json

    curves = json.loads((tmp_path / "i" / "interpolation.json").read_text())
    assert curves["naive"]["info"]["bn_reset"] is True
    assert main(["merge", a, b, "--method", "star-wm", "--out", str(tmp_path / "m")]) == 0
    assert "merged test accuracy" in capsys.readouterr().out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_bad_input_files(tmp_path_factory.mktemp("cli"))


def write_bad_input_files(root):
    """Checkpoints and broken inputs for the bad-input table, written into ``root``."""
    import hashlib
    import json

    import numpy as np
    import torch
    from safetensors.torch import save_file

    from lmckit.checkpoint import CHUNK_BYTES, chunk_digests, save_checkpoint
    from lmckit.data import write_idx
    from lmckit.models import build_model

    assert main(digits_mlp_args(root, seeds=[0, 1], epochs=1, hidden=[16])) == 0
    a, b = (str(root / f"mlp-digits-seed{s}.safetensors") for s in (0, 1))
    (root / "file").write_text("not a folder")
    (root / "folder").mkdir()
    meta = json.loads((root / "mlp-digits-seed0.json").read_text())
    for name, change in {
        # a config tampered with, in a sidecar without a key (a hand-made one): the shapes
        # are checked on the meta device before anything is allocated
        "huge": {
            "model": {**meta["model"], "hidden": [3_000_000]},
            "key": None,
            "key_document": None,
        },
        # the same tampering in a sidecar with its key: the key no longer fits it
        "tampered": {"model": {**meta["model"], "hidden": [3_000_000]}},
        "future": {"format_version": 7},
        "nodata": {"dataset": None},
    }.items():
        for suffix in (".safetensors",):
            (root / f"{name}{suffix}").write_bytes(
                (root / f"mlp-digits-seed0{suffix}").read_bytes()
            )
        (root / f"{name}.json").write_text(json.dumps({**meta, **change}))
    (root / "cut.json").write_text(json.dumps(meta))
    (root / "cut.safetensors").write_bytes(
        (root / "mlp-digits-seed0.safetensors").read_bytes()[:300]
    )
    nan = {k: v.clone() for k, v in build_model("mlp", **meta["model"]).state_dict().items()}
    nan["layers.1.weight"][0, 0] = float("nan")
    save_file(nan, root / "nan.safetensors")
    data = (root / "nan.safetensors").read_bytes()
    hashes = {
        "weights_sha256": hashlib.sha256(data).hexdigest(),
        "weights_sha256_chunks": {"bytes": CHUNK_BYTES, "digests": chunk_digests(data)},
    }
    (root / "nan.json").write_text(json.dumps({**meta, **hashes}))
    other = build_model("mlp", in_dim=64, hidden=[8], out_dim=10)
    save_checkpoint(root / "other", other, {"dataset": "digits"})
    bn = build_model("mlp", in_dim=64, hidden=[8], out_dim=10, norm="batch")
    save_checkpoint(root / "bn0", bn, {"dataset": "digits"})
    save_checkpoint(
        root / "bn1",
        build_model("mlp", in_dim=64, hidden=[8], norm="batch", out_dim=10),
        {"dataset": "digits"},
    )
    (root / "perm-types.json").write_text(json.dumps({"hidden0": ["a"] * 16}))
    (root / "perm-list.json").write_text(json.dumps([[0, 1]]))
    labels = root / "badlabels"
    labels.mkdir()
    rng = np.random.default_rng(0)
    for stem, n in (("train", 20), ("t10k", 10)):
        write_idx(
            labels / f"{stem}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28), dtype=np.uint8)
        )
        write_idx(labels / f"{stem}-labels-idx1-ubyte", np.full(n, 12, dtype=np.uint8))
    torch.manual_seed(0)
    return {"root": root, "a": a, "b": b}


def bad_inputs(f):
    """(id, argv, exit status, culprit in the message)."""
    r, a, b = f["root"], f["a"], f["b"]
    file, folder = str(r / "file"), str(r / "folder")
    train = ["train", "--model", "mlp", "--dataset", "digits", "--hidden", "8", "--epochs", "1"]
    tr = [*train, "--out", str(r / "t")]
    interp = ["interpolate", a, b, "--out", str(r / "i"), "--lambdas", "3"]
    merge = ["merge", a, b, "--out", str(r / "m")]
    match = ["match", a, b, "--out", str(r / "p.json")]
    # a device type this machine lacks: CUDA on CI, MPS on a CUDA machine
    absent = "mps" if torch.cuda.is_available() else "cuda"
    spec, shape5 = ["spec"], ["--input-shape", "5"]
    cumsum = "tests.tracing.test_trace:CumsumInTheMiddle"
    return [
        ("train-out-file", [*train, "--out", file], 2, "is a file"),
        ("train-out-under-file", [*train, "--out", f"{file}/x"], 2, "under a file"),
        ("train-out-unwritable", [*train, "--out", "/proc/lmckit-test"], 2, "/proc/lmckit-test"),
        ("match-out-folder", ["match", a, b, "--out", folder], 2, "is a folder"),
        ("match-out-under-file", ["match", a, b, "--out", f"{file}/p.json"], 2, "under a file"),
        ("match-out-unwritable", ["match", a, b, "--out", "/proc/p.json"], 2, "/proc"),
        ("interpolate-out-file", ["interpolate", a, b, "--out", file], 2, "is a file"),
        (
            "interpolate-out-under-file",
            ["interpolate", a, b, "--out", f"{file}/x"],
            2,
            "under a file",
        ),
        ("merge-out-file", ["merge", a, b, "--out", file], 2, "is a file"),
        ("merge-out-under-file", ["merge", a, b, "--out", f"{file}/x"], 2, "under a file"),
        ("sweep-out-file", ["merge", a, b, "--sweep-n", "2", "--out", file], 2, "is a file"),
        ("demo-out-file", ["demo", "--out", file, "-q"], 2, "is a file"),
        ("analyze-out-file", ["analyze", a, b, "--out", file], 2, "is a file"),
        ("analyze-one-checkpoint", ["analyze", a, "--out", str(r / "an")], 2, "two checkpoints"),
        (
            "analyze-counterexample-ckpt",
            ["analyze", a, "--counterexample", "--out", folder],
            2,
            "conflicts with --counterexample",
        ),
        ("analyze-gamma-1", ["analyze", a, b, "--gamma", "1", "--out", folder], 2, "--gamma"),
        ("analyze-method", ["analyze", a, b, "--method", "xx", "--out", folder], 2, "--method"),
        ("demo-out-under-file", ["demo", "--out", f"{file}/x", "-q"], 2, "under a file"),
        ("spec-no-shape", ["spec", "x:Y"], 2, "--input-shape"),
        ("spec-no-module", ["spec", "nosuch_mod:Thing", "--input-shape", "5"], 2, "nosuch_mod"),
        ("spec-not-a-module", [*spec, "lmckit.cli:main", *shape5], 2, "no torch.nn.Module"),
        ("spec-not-a-target", ["spec", "plain", *shape5], 2, "checkpoint plain"),
        ("spec-no-class", ["spec", "lmckit.cli:", *shape5], 2, "neither a checkpoint"),
        ("spec-args-not-json", [*spec, cumsum, *shape5, "--model-args", "{"], 2, "not JSON"),
        ("spec-args-list", [*spec, cumsum, *shape5, "--model-args", "[1]"], 2, "JSON object"),
        ("spec-args-wrong", [*spec, cumsum, *shape5, "--model-args", '{"k": 1}'], 2, "failed"),
        ("spec-strict", [*spec, cumsum, *shape5, "--strict"], 1, "aten.cumsum.default"),
        ("spec-out-file-dir", [*spec, cumsum, *shape5, "--out", folder], 2, "--out"),
        (
            "match-data-misfit",
            [*match, "--method", "am", "--dataset", "synthetic"],
            2,
            "does not fit",
        ),
        ("interpolate-data-misfit", [*interp, "--dataset", "synthetic"], 2, "does not fit"),
        ("merge-data-misfit", [*merge, "--dataset", "synthetic"], 2, "does not fit"),
        (
            "labels-out-of-range",
            [*interp, "--dataset", "fashion-mnist", "--data-dir", str(r / "badlabels")],
            1,
            "outside [0, 10)",
        ),
        ("device-unknown", [*match, "--device", "tpu"], 2, "--device"),
        ("device-unavailable", [*match, "--device", absent], 2, "is not available"),
        ("device-index", [*tr, "--device", "cuda:7"], 2, "--device"),
        ("lambdas-negative", [*interp, "--lambdas", "-3"], 2, "--lambdas"),
        ("lambdas-one", [*interp, "--lambdas", "1"], 2, "--lambdas"),
        ("sinkhorn-lr-negative", [*match, "--method", "sinkhorn", "--lr", "-1"], 2, "--lr"),
        ("lr-nan", [*tr, "--lr", "nan"], 2, "--lr"),
        ("landscape-one", [*merge, "--landscape", "1"], 2, "--landscape"),
        ("landscape-negative", [*merge, "--landscape", "-2"], 2, "--landscape"),
        ("width-nan", [*tr, "--width-multiplier", "nan"], 2, "--width-multiplier"),
        ("width-zero", [*tr, "--width-multiplier", "0"], 2, "--width-multiplier"),
        ("seed-negative", [*tr, "--seeds", "-1"], 2, "--seeds"),
        ("seed-huge", [*tr, "--seeds", "99999999999999999999"], 2, "--seeds"),
        ("match-seed-negative", [*match, "--seed", "-5"], 2, "--seed"),
        ("threads-negative", [*tr, "--threads", "-1"], 2, "--threads"),
        ("epochs-zero", [*tr, "--epochs", "0"], 2, "--epochs"),
        ("batch-size-zero", [*tr, "--batch-size", "0"], 2, "--batch-size"),
        ("warmup-too-long", [*tr, "--warmup-epochs", "5"], 2, "warmup_epochs"),
        ("bn-batches-zero", [*interp, "--bn-batches", "0"], 2, "--bn-batches"),
        ("probes-one", [*merge, "--sharpness-probes", "1"], 2, "--sharpness-probes"),
        ("sweep-malformed", [*merge, "--sweep-n", "2..x"], 2, "--sweep-n"),
        ("sweep-reversed", [*merge, "--sweep-n", "5..2"], 2, "--sweep-n"),
        ("sweep-too-small", [*merge, "--sweep-n", "1..3"], 2, "--sweep-n"),
        ("sweep-too-many", [*merge, "--sweep-n", "2..9"], 2, "asks for 9"),
        ("methods-without-sweep", [*merge, "--methods", "ccmm"], 2, "--methods"),
        ("merge-same-twice", ["merge", a, a, "--out", str(r / "m")], 2, "given twice"),
        (
            "merge-same-spelled-twice",
            ["merge", a, a.replace(".safetensors", ".json"), "--out", str(r / "m")],
            2,
            "given twice",
        ),
        ("merge-one", ["merge", a, "--out", str(r / "m")], 2, "at least two"),
        ("perm-wrong-types", [*interp, "--perm", str(r / "perm-types.json")], 1, "perm-types.json"),
        ("perm-a-list", [*interp, "--perm", str(r / "perm-list.json")], 1, "perm-list.json"),
        ("perm-folder", [*interp, "--perm", folder], 2, "--perm"),
        ("perm-missing", [*interp, "--perm", str(r / "none.json")], 2, "--perm"),
        (
            "sidecar-huge",
            ["match", str(r / "huge.json"), b, "--out", str(r / "p.json")],
            1,
            "has shape",
        ),
        (
            "sidecar-tampered",
            ["match", str(r / "tampered.json"), b, "--out", str(r / "p.json")],
            1,
            "its 'model' differs from the training its key records (in hidden)",
        ),
        (
            "sidecar-future",
            ["match", str(r / "future.json"), b, "--out", str(r / "p.json")],
            1,
            "format_version",
        ),
        (
            "sidecar-no-dataset",
            ["interpolate", str(r / "nodata.json"), b, "--out", str(r / "i")],
            2,
            "--dataset",
        ),
        (
            "weights-truncated",
            ["match", str(r / "cut.json"), b, "--out", str(r / "p.json")],
            1,
            "cut.safetensors",
        ),
        ("weights-nan", ["match", str(r / "nan.json"), b, "--out", str(r / "p.json")], 1, "NaN"),
        (
            "checkpoint-missing",
            ["match", a, str(r / "nope"), "--out", str(r / "p.json")],
            2,
            "not found",
        ),
        (
            "architectures-differ",
            ["match", a, str(r / "other.json"), "--out", str(r / "p.json")],
            2,
            "different architectures",
        ),
        (
            "repair-on-batchnorm",
            [
                "interpolate",
                str(r / "bn0.json"),
                str(r / "bn1.json"),
                "--repair",
                "--out",
                str(r / "i"),
            ],
            2,
            "--repair",
        ),
        ("data-dir-missing", [*interp, "--data-dir", str(r / "absent")], 2, "--data-dir"),
        ("data-dir-file", [*tr, "--data-dir", file], 2, "--data-dir"),
        ("dataset-unknown", [*tr, "--dataset", "imagenet"], 2, "imagenet"),
        ("model-unknown", ["train", "--model", "alexnet", "--out", str(r / "t")], 2, "alexnet"),
        (
            "model-needs-images",
            ["train", "--model", "vgg11", "--dataset", "synthetic", "--out", str(r / "t")],
            2,
            "needs image data",
        ),
        ("method-unknown", [*match, "--method", "magic"], 2, "--method"),
        (
            "match-out-over-input",
            ["match", a, b, "--out", a.replace(".safetensors", ".json")],
            2,
            "one of the inputs",
        ),
    ]


def unclear_lines(table, capsys) -> list[str]:
    """Run every ``(id, argv, exit status, culprit)`` of ``table``; what did not answer
    with that status and one error line naming the culprit (no traceback, no internal
    error)."""
    failures = []
    for case, argv, status, culprit in table:
        code = main(argv)
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        ok = (
            code == status
            and len(lines) == 1
            and "error" in lines[0]
            and culprit in lines[0]
            and "Traceback" not in err
            and "internal error" not in err
        )
        if not ok:
            failures.append(f"{case}: exit {code} (wanted {status}), stderr {err!r}")
    return failures


def test_every_bad_input_is_one_clear_line(files, capsys):
    failures = unclear_lines(bad_inputs(files), capsys)
    assert not failures, "\n".join(failures)
    for folder in ("t", "i", "m"):  # a bad command creates nothing
        assert not (files["root"] / folder).exists(), folder


def test_debug_shows_the_traceback(files):
    with pytest.raises(Exception, match="has shape"):
        main(["--debug", "match", str(files["root"] / "huge.json"), files["b"], "--out", "p.json"])


def test_a_folder_is_written_by_one_run_at_a_time(tmp_path, capsys):
    """Two `lmckit train` runs into one folder: the second is refused while the first runs,
    and the folder is free again once the first is killed (SIGKILL releases the lock)."""
    import signal
    import time

    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lmckit.cli",
            *digits_mlp_args(tmp_path, seeds=[0], epochs=400, hidden=[64]),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 60
        while (
            not (tmp_path / ".lmckit.lock").exists() or not (tmp_path / ".lmckit.lock").read_text()
        ):
            assert time.time() < deadline and first.poll() is None
            time.sleep(0.05)
        second = [*digits_mlp_args(tmp_path, seeds=[0], epochs=1, hidden=[64]), "--lr", "0.01"]
        assert main(second) == 2
        assert f"being written by another lmckit run (pid {first.pid})" in capsys.readouterr().err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert main(second) == 0  # the killed run's lock died with it
    assert not (tmp_path / "mlp-digits-seed0.safetensors.part").exists()


def test_spec_prints_the_report_and_writes_json(tmp_path, capsys):
    import json

    out = tmp_path / "spec.json"
    argv = ["spec", "tests.tracing.test_trace:TinyTransformer", "--input-shape", "6"]
    assert main([*argv, "--tokens", "11", "--model-args", '{"d": 8}', "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "7 groups" in printed and "verified in eval and train mode" in printed
    assert "embedding rows are looked up by token id: embed.weight[0]" in printed
    data = json.loads(out.read_text())
    stream = data["axes"]["embed.weight"][1]
    assert data["groups"][stream]["size"] == 8
    assert data["axes"]["head.weight"] == [None, stream]
    assert data["aliases"] == {"head.weight": "embed.weight"}


def test_spec_of_a_checkpoint_reads_the_example_input_from_its_dataset(tmp_path, capsys):
    """Formerly `lmckit spec CKPT` asked for --input-shape though the sidecar names the
    dataset; an explicit shape still wins, and a weight file without a sidecar still asks."""
    assert main(digits_mlp_args(tmp_path, seeds=[0], epochs=1, hidden=[16])) == 0
    ckpt = str(tmp_path / "mlp-digits-seed0.safetensors")
    capsys.readouterr()
    assert main(["spec", ckpt]) == 0
    printed = capsys.readouterr().out
    assert "example input: 1 8 8 (Gaussian inputs), from the checkpoint's dataset digits" in printed
    assert "1 groups" in printed and "16 units" in printed
    assert main(["spec", ckpt, "--input-shape", "64"]) == 0  # the MLP flattens: 64 fits too
    assert "example input" not in capsys.readouterr().out
    import shutil

    shutil.copy(ckpt, tmp_path / "bare.safetensors")  # weights without a sidecar
    assert main(["spec", str(tmp_path / "bare.safetensors")]) == 2
    assert "spec needs --input-shape" in capsys.readouterr().err


def test_match_and_interpolate_take_a_users_state_dicts(tmp_path, capsys):
    """Plain state dicts (safetensors and a weights_only .pt) of a user's class: the spec is
    traced, a planted permutation is found exactly, and the path is evaluated."""
    import json

    from safetensors.torch import save_file

    from lmckit.perm import Permutation
    from lmckit.tracing import trace
    from tests.tracing.test_trace import DigitsCNN

    torch.manual_seed(0)
    model = DigitsCNN()
    a = {k: v.clone() for k, v in model.state_dict().items()}
    spec = trace(model, torch.randn(4, 1, 8, 8))
    b = Permutation.random(spec, 1).apply(a)
    save_file(a, tmp_path / "a.safetensors")
    torch.save(b, tmp_path / "b.pt")
    user = ["--model-class", "tests.tracing.test_trace:DigitsCNN", "--input-shape", "1", "8", "8"]
    pair = [str(tmp_path / "a.safetensors"), str(tmp_path / "b.pt")]
    out = tmp_path / "perm.json"
    assert main(["match", *pair, *user, "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "-> 0.0000" in printed  # L2 distance after alignment
    assert set(json.loads(out.read_text())["perm"]) == set(spec.groups)
    # activation matching reads the user's model through its traced graph
    am = ["match", *pair, *user, "--method", "am", "--dataset", "digits", "-q"]
    assert main([*am, "--out", str(tmp_path / "am.json")]) == 0
    assert "-> 0.0000" in capsys.readouterr().out
    args = ["interpolate", *pair, *user, "--dataset", "digits", "--lambdas", "3", "-q"]
    assert main([*args, "--out", str(tmp_path / "curve")]) == 0
    assert "wm-fast" in capsys.readouterr().out
    torch.manual_seed(123)  # another model: a permuted copy has no direction for Taylor
    torch.save(DigitsCNN().state_dict(), tmp_path / "other.pt")
    other = [pair[0], str(tmp_path / "other.pt")]
    analyze = ["analyze", *other, *user, "--dataset", "digits", "--method", "wm-fast", "-q"]
    assert main([*analyze, "--out", str(tmp_path / "an")]) == 0
    assert json.loads((tmp_path / "an" / "analysis.json").read_text())
    capsys.readouterr()
    # three copies of one model merge back into it; the merge is a plain state dict
    torch.save(Permutation.random(spec, 2).apply(a), tmp_path / "c.pt")
    merge = ["merge", *pair, str(tmp_path / "c.pt"), *user, "--dataset", "digits", "-q"]
    assert main([*merge, "--method", "merge-many", "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    from safetensors.torch import load_file

    merged = load_file(tmp_path / "m" / "merged.safetensors")
    reference = Permutation.random(spec, 2).apply(a)  # the last model is the reference
    weights = dict(model.named_parameters())  # buffers: BN statistics are re-estimated
    assert all(torch.allclose(merged[k], reference[k], atol=1e-5) for k in weights)
    assert json.loads((tmp_path / "m" / "merged.json").read_text())["model"]["class"] == user[1]
    # the same weights without --model-class are not lmckit checkpoints
    assert main(["match", *pair, "--out", str(tmp_path / "p2.json")]) == 2
    assert "needs --model-class and --input-shape" in capsys.readouterr().err
    assert main(["match", *pair, "--model-class", user[1], "--out", str(out)]) == 2
    assert "--model-class needs --input-shape" in capsys.readouterr().err
    wrong = {**a, "fc1.weight": torch.zeros(3, 3)}
    save_file(wrong, tmp_path / "wrong.safetensors")
    bad = [str(tmp_path / "wrong.safetensors"), pair[1]]
    assert main(["match", *bad, *user, "--out", str(out)]) == 1
    assert "['fc1.weight'] has shape (3, 3), DigitsCNN expects (12, 96)" in capsys.readouterr().err


def test_train_on_one_part_of_a_split_records_it_and_keeps_to_it(tmp_path, capsys):
    """A class-imbalanced part a with fraction 0.02 holds 2 % of each lower class and all
    of each upper one: a model trained on it predicts (almost) only the upper classes, the
    sidecar names the split and the hash of its indices, and another split into the same
    folder is refused with the difference. Fractions of 0 or 1 (disjoint classes) are
    refused."""
    from lmckit.checkpoint import load_checkpoint
    from lmckit.data import Split, indices_digest, load_dataset

    split = ["--split", "class-imbalanced", "--fraction", "0.02", "--part", "a"]
    args = digits_mlp_args(tmp_path, seeds=[0], epochs=3, hidden=[32, 32]) + split
    assert main(args) == 0
    assert "class-imbalanced(0.02) part a" in capsys.readouterr().out
    ckpt = load_checkpoint(tmp_path / "mlp-digits-seed0-class-imbalanced-parta.safetensors")
    data = load_dataset("digits")
    part = Split("class-imbalanced", 0, fraction=0.02).indices(data.train_y)
    recorded = ckpt.meta["split"]
    labels = data.train_y[part]
    assert recorded["examples"] == len(part) and set(labels.tolist()) == set(range(10))
    assert (labels < 5).double().mean() < 0.05
    assert recorded["indices_sha256"] == indices_digest(part)
    assert recorded["kind"] == "class-imbalanced" and recorded["part"] == 0
    predicted = ckpt.model.eval()(data.test_x).argmax(1)
    assert (predicted >= 5).double().mean() > 0.9
    other = [*args[:-4], "--fraction", "0.3", "--part", "a"]
    assert main(other) == 1  # a checkpoint error, not a usage error
    err = capsys.readouterr().err
    assert "trained otherwise" in err and "split.fraction: found 0.02, wanted 0.3" in err
    for fraction in ("0", "1"):
        assert main([*args[:-4], "--fraction", fraction, "--part", "a"]) == 2
        assert "fraction" in capsys.readouterr().err


def test_dirichlet_clients_and_a_shared_initialisation(tmp_path, capsys):
    from lmckit.checkpoint import load_checkpoint

    base = [*digits_mlp_args(tmp_path, seeds=[0, 1], epochs=1, hidden=[16]), "--lr", "1e-9"]
    fed = ["--split", "dirichlet", "--clients", "3", "--alpha", "0.5"]
    for part in ("0", "2"):
        assert main(base + fed + ["--part", part, "--init-seed", "4"]) == 0
    capsys.readouterr()
    stems = [f"mlp-digits-seed{s}-dirichlet-part{p}" for s in (0, 1) for p in (0, 2)]
    ckpts = [load_checkpoint(tmp_path / f"{stem}.safetensors") for stem in stems]
    first = ckpts[0].params["layers.0.weight"]
    # one initialisation for every seed and client; a learning rate of 1e-9 keeps it there
    assert all(torch.allclose(c.params["layers.0.weight"], first, atol=1e-6) for c in ckpts)
    assert ckpts[0].meta["split"]["examples"] + ckpts[1].meta["split"]["examples"] < 1797
    assert main([*base, "--out", str(tmp_path / "own")]) == 0  # no --init-seed: seeds differ
    own = [load_checkpoint(tmp_path / "own" / f"mlp-digits-seed{s}.safetensors") for s in (0, 1)]
    assert not torch.allclose(own[0].params["layers.0.weight"], own[1].params["layers.0.weight"])
    assert "split" not in own[0].meta["train"] and own[0].meta["split"] is None
    assert main([*base, "--split", "dirichlet", "--out", str(tmp_path / "x")]) == 2
    assert "--split dirichlet needs --part" in capsys.readouterr().err
    assert main(base + fed + ["--part", "3", "--out", str(tmp_path / "x")]) == 2
    assert "split part must be 0 … 2, got 3" in capsys.readouterr().err


def test_merge_of_models_trained_on_the_two_halves_reports_each_half(tmp_path, capsys):
    import json

    for part in ("a", "b"):
        split = ["--split", "class-imbalanced", "--fraction", "0.2", "--part", part]
        args = digits_mlp_args(tmp_path, seeds=[0], epochs=5, hidden=[24])
        assert main([*args, *split, "--batch-size", "64"]) == 0
    ckpts = [str(tmp_path / f"mlp-digits-seed0-class-imbalanced-part{p}.safetensors") for p in "ab"]
    out = tmp_path / "merged"
    assert main(["merge", *ckpts, "--method", "average", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "accuracy % on each part's majority classes" in printed and "ensemble" in printed
    report = json.loads((out / "metrics.json").read_text())
    assert report["groups"] == {"part a": [5, 6, 7, 8, 9], "part b": [0, 1, 2, 3, 4]}
    a, b = report["models"]["input 0"]["groups"], report["models"]["input 1"]["groups"]
    # each input is better on the classes it saw most of
    assert a["part a"] > a["part b"] and b["part b"] > b["part a"]
    assert report["merged_accuracy_part_a"] == report["models"]["merged"]["groups"]["part a"]


def test_every_option_of_every_command_has_a_help_text():
    """`lmckit COMMAND --help` explains every option and positional argument (the lists of
    models, datasets and methods in them come from the registries)."""
    import argparse

    from lmckit.cli import build_parser
    from lmckit.cli.arguments import RenamedOption
    from lmckit.models import ALIASES, MODELS

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        (command, action.option_strings or action.dest)
        for command, p in sub.choices.items()
        for action in p._actions
        if not isinstance(action, argparse._HelpAction | RenamedOption)  # old, hidden spellings
        and (not action.help or action.help == argparse.SUPPRESS)
    ]
    assert missing == []
    train = next(a for a in sub.choices["train"]._actions if "--model" in a.option_strings)
    assert all(name in train.help for name in [*MODELS, *ALIASES])


def test_the_catalog_the_help_is_built_from_is_the_registries():
    """`lmckit --help` reads src/lmckit/_catalog.py (plain data, no torch); it must say what
    the registries hold (rewrite it with scripts/write_catalog.py after adding to them)."""
    import sys
    from pathlib import Path

    from lmckit import _catalog

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        from write_catalog import live
    finally:
        sys.path.pop(0)
    expected = live()
    assert {name: getattr(_catalog, name) for name in expected} == expected


def test_help_imports_no_torch():
    """Asking for help is instant: building the parser and printing any command's help
    loads no torch (3–5 s of CPU before)."""
    import subprocess
    import sys

    code = (
        "import contextlib, io, sys\n"
        "from lmckit.cli import build_parser\n"
        "parser = build_parser()\n"
        "for command in ('train', 'match', 'merge', 'run', 'interpolate'):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        parser.parse_args([command, '--help'])\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_value_that_starts_with_a_dash_is_named_not_called_missing(tmp_path, capsys):
    """`--max-memory -1G`: argparse reads -1G as an option and said the option had no
    argument; the message names the value and how to give it."""
    out = str(tmp_path / "p.json")
    assert main(["match", "--max-memory", "-1G", "a", "b", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "'-1G' was read as an option" in err and "--max-memory=-1G" in err
    assert main(["match", "--max-memory=-1G", "a", "b", "--out", out]) == 2
    assert "is not a size" in capsys.readouterr().err
    # a real missing argument (or a known option in its place) keeps argparse's message
    assert main(["match", "--out"]) == 2
    assert "expected one argument" in capsys.readouterr().err
    assert main(["match", "--out", "--quiet"]) == 2
    assert "expected one argument" in capsys.readouterr().err


def test_a_sidecar_edited_after_training_is_refused(tmp_path, capsys):
    """The sidecar records its training's key (the SHA-256 of its key document): an edited
    document (epochs 99), or a 'train' or 'model' that no longer agrees with it, is named
    — it was read as a training that never ran, and reused as another's result."""
    import json

    from lmckit.checkpoint import load_checkpoint
    from lmckit.errors import CheckpointError
    from lmckit.store import content_hash

    assert main(digits_mlp_args(tmp_path, seeds=[0], epochs=1, hidden=[8])) == 0
    capsys.readouterr()
    stem = tmp_path / "mlp-digits-seed0"
    meta = json.loads(stem.with_suffix(".json").read_text())
    assert content_hash(meta["key_document"]) == meta["key"]  # the store's own hash
    load_checkpoint(stem)
    weights = stem.with_suffix(".safetensors").read_bytes()
    edits = {
        "document": ("key_document", "settings", "train", "epochs"),
        "train": ("train", "epochs"),
        "model": ("model", "hidden"),
    }
    for name, where in edits.items():
        edited = json.loads(json.dumps(meta))
        node = edited
        for k in where[:-1]:
            node = node[k]
        node[where[-1]] = 99 if where[-1] == "epochs" else [9]
        (tmp_path / f"{name}.json").write_text(json.dumps(edited))
        (tmp_path / f"{name}.safetensors").write_bytes(weights)
        said = "key_document was edited" if name == "document" else f"its '{name}' differs"
        with pytest.raises(CheckpointError, match=said):
            load_checkpoint(tmp_path / name)


def test_seed_on_an_average_is_refused_even_with_batchnorm_and_taken_with_probes(tmp_path, capsys):
    """The BatchNorm reset after an average combines the statistics of all the training
    examples exactly: two seeds give the same merge, so --seed on an average is refused
    for BatchNorm models too — and taken where sharpness probes draw."""
    args = [*digits_mlp_args(tmp_path, seeds=[0, 1], epochs=1, hidden=[8]), "--norm", "batch"]
    assert main(args) == 0
    ckpts = [str(tmp_path / f"mlp-digits-seed{s}.safetensors") for s in (0, 1)]
    merge = ["merge", *ckpts, "--method", "average", "-q"]
    assert main([*merge, "--out", str(tmp_path / "m0")]) == 0
    assert main([*merge, "--seed", "3", "--out", str(tmp_path / "m3")]) == 2
    assert "--seed does not apply here: average draws nothing" in capsys.readouterr().err
    probes = ["--sharpness-probes", "2", "--seed", "3", "--out", str(tmp_path / "p3")]
    assert main([*merge, *probes]) == 0
