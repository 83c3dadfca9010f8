"""Figures draw PNGs and nothing else; their data is written by the callers."""

from lmckit.evaluate import Curve
from lmckit.plots import plot_barriers, plot_geometry, plot_interpolation, plot_sweep

PNG = b"\x89PNG\r\n\x1a\n"


def test_plots_write_only_their_png(tmp_path):
    curve = Curve(
        [0.0, 0.5, 1.0],
        {
            "test": {
                "loss": [0.3, 0.9, 0.4],
                "accuracy": [0.9, 0.6, 0.88],
                "ensemble_loss": [0.3, 0.25, 0.4],
                "ensemble_accuracy": [0.9, 0.92, 0.88],
            }
        },
    )
    paths = [
        plot_interpolation({"naive": curve}, tmp_path / "curve.png", title="t"),
        plot_barriers({"naive": {"loss": 1.0, "accuracy": 0.1}}, tmp_path / "bars.png"),
        plot_sweep(
            {"ccmm": {2: {"merged_accuracy": 0.8, "loss_gap": 0.1}}}, tmp_path / "sweep.png"
        ),
        plot_geometry([1.0, float("nan")], [60.0, float("nan")], tmp_path / "geometry.png"),
    ]
    for path in paths:
        assert path.read_bytes()[:8] == PNG
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
