import subprocess
import sys

import pytest

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


def test_help_and_unknown_command():
    assert main(["info", "--verbose"]) == 0
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2


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
    from lmckit.experiments.matching import load_permutation
    from lmckit.perm import params_distance

    train = digits_mlp_args(tmp_path, seeds=[0, 1], epochs=1, hidden=[32, 32])
    assert main(train) == 0
    a, b = (tmp_path / f"mlp-digits-seed{s}.safetensors" for s in (0, 1))
    for method in ("wm", "wm-fast", "am", "ste", "sinkhorn"):
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


@pytest.mark.slow
def test_demo_runs_on_digits_and_reuses_its_results(tmp_path, capsys):
    args = ["demo", "--out", str(tmp_path), "--dataset", "digits", "--epochs", "4", "-q"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for method in ("naive", "WM", "AM", "STE", "Sinkhorn"):
        assert f"| {method} |" in out
    assert (tmp_path / "interpolation.png").exists() and (tmp_path / "results.md").exists()
    import json

    first = json.loads((tmp_path / "results.json").read_text())
    assert main(args) == 0
    assert "cached" in capsys.readouterr().out
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == first["rows"]


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
    ):
        assert (out / name).exists(), name
    from lmckit.checkpoint import load_checkpoint

    merged = load_checkpoint(out / "merged.safetensors")
    assert merged.meta["merge_method"] == "merge-many"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n"] == 3 and "sharpness_merged" in metrics
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
    assert (sweep / "sweep.png").exists() and len(list((sweep / "sweep").glob("*.json"))) == 6
    assert main(args) == 0
    assert capsys.readouterr().out.count("cached") == 6
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
