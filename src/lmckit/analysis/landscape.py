"""Loss and accuracy on the plane through three models (Git-Re-Basin analysis, Fig. 5)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmckit.data import DataSource
from lmckit.errors import ParamsError
from lmckit.evaluate import bn_reset, evaluate
from lmckit.options import checked
from lmckit.params import Params, floating_names
from lmckit.progress import ProgressCallback, notify


@dataclass
class Landscape:
    """Grid evaluation on the plane ``θ(x, y) = θ_1 + x·u + y·v`` where ``u`` is the unit
    vector towards θ_2 and ``v`` the unit vector of θ_3's orthogonal component.

    ``points`` are the three models' ``(x, y)`` coordinates; ``loss``/``accuracy`` are
    ``(len(ys), len(xs))`` grids."""

    xs: list[float]
    ys: list[float]
    loss: list[list[float]]
    accuracy: list[list[float]]
    points: list[tuple[float, float]]

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return vars(self)


@checked
def plane_landscape(
    model: nn.Module,
    three: Sequence[Params],
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    resolution: int = 11,
    margin: float = 0.2,
    bn_reset_data: DataSource | None = None,
    progress: ProgressCallback | None = None,
) -> Landscape:
    """Evaluate ``loader`` on a ``resolution × resolution`` grid covering the triangle of
    the three models plus ``margin`` (a fraction of its extent) on every side; BN models are
    BN-reset on ``bn_reset_data`` at every point when given. ``progress`` gets a
    :class:`~lmckit.progress.Progress` after every point."""
    if len(three) != 3:
        raise ParamsError(f"plane_landscape needs exactly 3 models, got {len(three)}")
    if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 2:
        raise ParamsError(f"resolution must be an integer ≥ 2, got {resolution!r}")
    if not (math.isfinite(margin) and margin >= 0):
        raise ParamsError(f"margin must be a finite number ≥ 0, got {margin!r}")
    keys = floating_names(three[0])
    flat = [torch.cat([p[k].detach().reshape(-1).double() for k in keys]) for p in three]
    u = flat[1] - flat[0]
    u_norm = u.norm()
    u = u / u_norm
    w = flat[2] - flat[0]
    v = w - (w @ u) * u
    v_norm = v.norm()
    if float(u_norm) == 0 or float(v_norm) == 0:
        raise ParamsError("the three models are collinear or equal; no plane through them")
    v = v / v_norm
    points = [(0.0, 0.0), (float(u_norm), 0.0), (float(w @ u), float(v_norm))]
    x_lo, x_hi = min(p[0] for p in points), max(p[0] for p in points)
    y_lo, y_hi = min(p[1] for p in points), max(p[1] for p in points)
    dx, dy = margin * (x_hi - x_lo), margin * (y_hi - y_lo)
    xs = torch.linspace(x_lo - dx, x_hi + dx, resolution).tolist()
    ys = torch.linspace(y_lo - dy, y_hi + dy, resolution).tolist()
    shapes = [(k, three[0][k].shape, three[0][k].dtype) for k in keys]
    loss = [[0.0] * resolution for _ in ys]
    acc = [[0.0] * resolution for _ in ys]
    done = 0
    for iy, y in enumerate(ys):
        for ix, x in enumerate(xs):
            point = flat[0] + x * u + y * v
            params, offset = dict(three[0]), 0
            for k, shape, dtype in shapes:
                n = int(torch.Size(shape).numel())
                params[k] = point[offset : offset + n].view(shape).to(dtype)
                offset += n
            if bn_reset_data is not None:
                params = bn_reset(model, params, bn_reset_data)
            m = evaluate(model, params, loader)
            loss[iy][ix], acc[iy][ix] = m.loss, m.accuracy
            done += 1
            notify(progress, done, resolution * resolution)
    return Landscape(xs, ys, loss, acc, points)


@checked
def triangle_summary(landscape: Landscape) -> dict[str, float]:
    """What Ito et al. Fig. 5 is read for, from the grid points inside the triangle of the
    three models (edges included, by barycentric coordinates): ``accuracy_min_inside`` and
    ``accuracy_mean_inside``, ``loss_max_inside`` — how far the plane between the models
    falls below them — and ``points_inside``, how many grid points that is; ``{}`` when no
    grid point falls inside."""
    (x1, y1), (x2, y2), (x3, y3) = landscape.points
    area = (x2 - x1) * (y3 - y1) - (x3 - x1) * (y2 - y1)
    inside = []
    for iy, y in enumerate(landscape.ys):
        for ix, x in enumerate(landscape.xs):
            l2 = ((x - x1) * (y3 - y1) - (x3 - x1) * (y - y1)) / area
            l3 = ((x2 - x1) * (y - y1) - (x - x1) * (y2 - y1)) / area
            if min(l2, l3, 1 - l2 - l3) >= -1e-9:  # slack: points on the edges count
                inside.append((landscape.accuracy[iy][ix], landscape.loss[iy][ix]))
    if not inside:
        return {}
    return {
        "accuracy_min_inside": min(a for a, _ in inside),
        "accuracy_mean_inside": sum(a for a, _ in inside) / len(inside),
        "loss_max_inside": max(loss for _, loss in inside),
        "points_inside": float(len(inside)),
    }
