"""STE-MM: simplex weights and the multi-model straight-through estimator."""

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.merge import star, ste_mm
from lmckit.merge.ste_mm import simplex_weights
from lmckit.metrics import evaluate
from lmckit.models import permutation_spec
from lmckit.resume import ResumeError, saved_progress
from tests.merge.common import random_models
from tests.zoo import train_mlp


def test_simplex_weights():
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([simplex_weights(3, g) for _ in range(4000)])
    assert torch.allclose(draws.sum(1), torch.ones(4000, dtype=torch.float64))
    assert (draws > 0).all()
    assert draws[:, 0].mean().item() == pytest.approx(1 / 3, abs=0.02)
    # Dirichlet(1,1,1): each coordinate is Beta(1, 2) with variance 1/18
    assert draws[:, 0].var().item() == pytest.approx(1 / 18, rel=0.1)
    with pytest.raises(ParamsError):
        simplex_weights(3, g, "gaussian")


def test_ste_mm_reports_every_step_and_checks_its_options(digits):
    model, spec, params = random_models(3)
    events = []
    result = ste_mm(
        spec, params, model=model, data=digits, epochs=1, batch_size=256, progress=events.append
    )
    steps = len(digits.loader("train", batch_size=256))
    assert result.iterations == steps and [e.step for e in events] == list(range(1, steps + 1))
    assert len(result.history) == 1
    with pytest.raises(ParamsError, match="epochs"):
        ste_mm(spec, params, model=model, data=digits, epochs=0)


@pytest.fixture(scope="module")
def trained(digits):
    models = [train_mlp(digits, s, hidden=(32, 32), epochs=10) for s in range(3)]
    return models[0], permutation_spec(models[0]), [m.state_dict() for m in models]


def test_ste_mm_finds_a_better_basin_than_star_weight_matching(trained, digits):
    model, spec, params = trained
    test = digits.loader("test", batch_size=360)
    baseline = star(spec, params)
    result = ste_mm(spec, params, model=model, data=digits, epochs=2, lr=1e-2)
    assert result.perms != baseline.perms
    assert evaluate(model, result.merged, test).loss < evaluate(model, baseline.merged, test).loss


def test_the_permutations_are_projections_of_the_trained_proxies(trained, digits):
    """After one large step the proxies have moved, so the final projection (Alg. 1 line 12)
    differs from the projection made before the step, which is star weight matching."""
    model, spec, params = trained
    one_batch = [next(iter(digits.loader("train", batch_size=256)))]
    result = ste_mm(spec, params, model=model, data=one_batch, epochs=1, lr=0.03)
    baseline = star(spec, params)
    assert result.perms[:2] != baseline.perms[:2] and result.perms[2].is_identity()


def test_projections_run_side_by_side_to_the_one_thread_result(trained, digits, monkeypatch):
    """With two torch threads the two projections of a step run in two threads, each with one
    torch thread, and the merge is a one-thread run's, bit for bit (perms, weights, LAP
    count); the thread count is restored afterwards."""
    import threading

    from lmckit.match.weight_matcher import WeightMatcher

    model, spec, params = trained
    options = {"epochs": 1, "lr": 1e-2, "batch_size": 256, "recipe": "paper", "seed": 5}
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = ste_mm(spec, params, model=model, data=digits, **options)
        seen = []
        match = WeightMatcher.match

        def spy(self, *args, **kwargs):
            seen.append((threading.current_thread().name, torch.get_num_threads()))
            return match(self, *args, **kwargs)

        monkeypatch.setattr(WeightMatcher, "match", spy)
        torch.set_num_threads(2)
        side_by_side = ste_mm(spec, params, model=model, data=digits, **options)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert side_by_side.info["projection_threads"] == 2 and alone.info["projection_threads"] == 1
    assert len({name for name, _ in seen}) == 2 and {t for _, t in seen} == {1}
    assert side_by_side.perms == alone.perms
    assert side_by_side.info["lap_solves"] == alone.info["lap_solves"]
    assert all(torch.equal(side_by_side.merged[k], v) for k, v in alone.merged.items())


def test_fixed_mixture_weights_steer_the_merge(trained, digits):
    model, spec, params = trained
    uniform = ste_mm(spec, params, model=model, data=digits, epochs=1, lr=1e-2, weights=[1, 1, 1])
    skewed = ste_mm(spec, params, model=model, data=digits, epochs=1, lr=1e-2, weights=[8, 1, 1])
    assert uniform.info["weights"] == pytest.approx([1 / 3] * 3)
    assert uniform.perms != skewed.perms
    for bad in ([1, 1], [1, -1, 1], [0, 0, 0], "gaussian", [float("nan")] * 3):
        with pytest.raises(ParamsError, match="weights"):
            ste_mm(spec, params, model=model, data=digits, weights=bad)


def test_cold_duals_give_the_warm_result_and_identity_restarts_run_alg_1(trained, digits):
    """STE-MM Fig. 2's comparison: LAP duals carried between projections only save work —
    with them off, every step's permutations and the merge are the same. Restarting each
    projection from the identity (Alg. 1 as written) is a different, valid run: its first
    projection is star weight matching's, as the default's is."""
    model, spec, params = trained
    batches = [next(iter(digits.loader("train", batch_size=128)))] * 3
    options = dict(model=model, data=batches, epochs=2, lr=1e-2, seed=1)
    warm = ste_mm(spec, params, **options)
    cold = ste_mm(spec, params, warm_duals=False, **options)
    assert warm.perms == cold.perms
    assert all(torch.equal(warm.merged[k], cold.merged[k]) for k in warm.merged)
    assert warm.info["warm_duals"] and not cold.info["warm_duals"]
    restart = ste_mm(spec, params, restart_from_identity=True, **options)
    assert restart.info["restart_from_identity"] and restart.perms[-1].is_identity()
    # from the identity every projection sweeps again; from the last permutation one
    # confirming sweep re-solves only what moved
    assert restart.info["lap_solves"] > warm.info["lap_solves"] == cold.info["lap_solves"]
    one = ste_mm(spec, params, model=model, data=batches[:1], epochs=1, lr=1e-12, seed=1,
                 restart_from_identity=True)  # fmt: skip
    assert one.perms == star(spec, params, seed=1).perms  # a vanishing step: WM of θ_ref


def test_the_paper_recipe_is_stemm_alg_1_written_out(trained, digits):
    """``recipe="paper"`` against Alg. 1 by hand: proxies start at θ_n; each step projects
    every proxy by weight matching from the identity, draws λ as normalised U(0, 1) draws,
    and moves each proxy by Adam along λ_i times the mixture's gradient (straight
    through); the final projections are the permutations (line 12)."""
    import torch.nn.functional as F

    from lmckit.match import weight_matching

    model, spec, params = trained
    batches = [(digits.train_x[i : i + 64], digits.train_y[i : i + 64]) for i in range(0, 320, 64)]
    lr = 0.05
    result = ste_mm(spec, params, model=model, data=batches, epochs=1, lr=lr, seed=2,
                    recipe="paper")  # fmt: skip
    n, ref = len(params), len(params) - 1
    proxies = [{k: params[ref][k].clone().requires_grad_(True) for k in params[ref]}
               for _ in range(n - 1)]  # fmt: skip
    adam = torch.optim.Adam([t for p in proxies for t in p.values()], lr=lr)
    generator = torch.Generator().manual_seed(2)

    def project(i):
        detached = {k: v.detach() for k, v in proxies[i].items()}
        return weight_matching(spec, detached, params[i], seed=2, warm_start=False).perm

    for x, y in batches:
        perms = [project(i) for i in range(n - 1)]
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        lam = u / u.sum()  # Alg. 1 lines 4-5, not a Dirichlet draw
        members = [perms[i].apply(params[i]) for i in range(n - 1)] + [params[ref]]
        mix = {k: sum(float(lam[i]) * members[i][k] for i in range(n)).requires_grad_(True)
               for k in params[ref]}  # fmt: skip
        loss = F.cross_entropy(torch.func.functional_call(model, mix, (x,)), y)
        grads = dict(zip(mix, torch.autograd.grad(loss, list(mix.values())), strict=True))
        adam.zero_grad()
        for i in range(n - 1):
            for k, t in proxies[i].items():
                t.grad = float(lam[i]) * grads[k]
        adam.step()
    final = [project(i) for i in range(n - 1)]
    assert list(result.perms[:-1]) == final and result.perms[-1].is_identity()
    assert final != list(star(spec, params, seed=2).perms[:-1])  # the descent moved them
    assert result.info["recipe"] == "paper"
    assert result.info["weights"] == "normalized_uniform" and result.info["restart_from_identity"]
    dirichlet = ste_mm(spec, params, model=model, data=batches, epochs=1, lr=lr, seed=2,
                       restart_from_identity=True)  # fmt: skip
    assert dirichlet.perms != result.perms  # the weight draw is part of the recipe
    with pytest.raises(ParamsError, match="recipe must be one of"):
        ste_mm(spec, params, model=model, data=batches, recipe="alg1")
    with pytest.raises(ParamsError, match=r"fixed weights=\[1, 1, 1\] do not apply"):
        ste_mm(spec, params, model=model, data=batches, recipe="paper", weights=[1, 1, 1])


class Killed(Exception):
    """Stands for the process being killed in the middle of an epoch."""


@pytest.mark.parametrize(
    ("recipe", "kill_at_step"),
    [("lmckit", 1), ("paper", 1), ("lmckit", 3)],  # 1: the save at the epoch's end; 3: within
)
def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_merge(
    trained, digits, tmp_path, recipe, kill_at_step
):
    """Killed in its third of four epochs and run again, STE-MM goes on from its last save
    (the end of the second epoch, or two steps into the third) — its proxies, Adam,
    permutations, duals, the λ generator, the batch order and the epoch's running loss —
    to the permutations and weights of a run never interrupted. lmckit's recipe starts
    each projection at the previous permutation, so the permutations must be restored
    too; λ draws and the data order differ per step and epoch, so must the generator and
    the position in the epoch."""
    model, spec, params = trained
    options = {"epochs": 4, "lr": 1e-2, "batch_size": 256, "recipe": recipe, "seed": 3}
    straight = ste_mm(spec, params, model=model, data=digits, **options)
    per_epoch = len(digits.loader("train", batch_size=256))
    seen = []

    def kill_in_epoch_3(event):
        seen.append(event.metrics["epoch"])
        if seen.count(3) == kill_at_step:
            raise Killed

    path = tmp_path / "m.resume"
    with pytest.raises(Killed):
        ste_mm(spec, params, model=model, data=digits, resume=path, resume_every=0,
               progress=kill_in_epoch_3, **options)  # fmt: skip
    saved = saved_progress(path)
    assert (saved["epoch"], saved["step_in_epoch"]) == (2, kill_at_step - 1)
    assert saved["steps_per_epoch"] == per_epoch  # for lmckit status's estimate of time left
    if kill_at_step == 1:  # as an lmckit that saved at epochs' ends only wrote it
        _drop_info_entries(path, ("step_in_epoch", "loss_sum", "count"))
    epochs = []
    resumed = ste_mm(spec, params, model=model, data=digits, resume=path,
                     progress=lambda e: epochs.append(e.metrics["epoch"]), **options)  # fmt: skip
    # the killed step is trained again, the ones saved before it are not
    assert epochs == [3] * (per_epoch - kill_at_step + 1) + [4] * per_epoch
    assert resumed.perms == straight.perms
    assert resumed.history == straight.history and resumed.iterations == straight.iterations
    assert all(torch.equal(resumed.merged[k], v) for k, v in straight.merged.items())
    if kill_at_step > 1:
        return
    other_seed = {**options, "seed": 4}
    with pytest.raises(ResumeError, match=r"another run \(options\.seed: 3 → 4\)"):
        ste_mm(spec, params, model=model, data=digits, resume=path, **other_seed)
    with pytest.raises(ResumeError, match="models"):  # another set of models, same options
        ste_mm(spec, params[::-1], model=model, data=digits, resume=path, **options)


def test_a_resumed_run_saves_where_it_began_for_the_estimate_of_time_left(
    trained, digits, tmp_path
):
    """The resume file records where the process that wrote it started (lmckit status's
    pace): a fresh run from the start; a run resumed at step 2 of epoch 2 from there, with
    the seconds the first process had kept."""
    model, spec, params = trained
    options = {"epochs": 3, "lr": 1e-2, "batch_size": 256, "seed": 3}
    path = tmp_path / "m.resume"

    def kill_at(epoch, step):
        seen = []

        def progress(event):
            seen.append(event.metrics["epoch"])
            if seen.count(epoch) == step:
                raise Killed

        return progress

    for epoch in (2, 3):
        with pytest.raises(Killed):
            ste_mm(spec, params, model=model, data=digits, resume=path, resume_every=0,
                   progress=kill_at(epoch, 3), **options)  # fmt: skip
        saved = saved_progress(path)
        assert (saved["epoch"], saved["step_in_epoch"]) == (epoch - 1, 2)
        if epoch == 2:
            assert saved["resumed_from"] == {"epoch": 0, "step_in_epoch": 0, "seconds": 0.0}
            first = saved
        else:
            assert saved["resumed_from"] == {"epoch": 1, "step_in_epoch": 2,
                                             "seconds": first["seconds"]}  # fmt: skip
            assert saved["seconds"] > first["seconds"]


def _drop_info_entries(path, names):
    """Rewrite a resume file without some entries of its JSON info."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    info = {k: v for k, v in json.loads(metadata["info"]).items() if k not in names}
    save_file(tensors, str(path), metadata={**metadata, "info": json.dumps(info)})
