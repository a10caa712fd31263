"""STk §4: the Gaussian data generator, the LDA boundary, ParaF1, the synthetic population (the
executor's grouped layout with Adam) against a plain torch.optim.Adam loop, the Table 1 solvers,
and the scripts end to end on tiny settings."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import ROOT
from topklab.engine.aggregates import build_paper_update_aggregate
from topklab.engine.population import initial_threshold
from topklab.synthetic import GaussianTask, lda_boundary, para_f1
from topklab.synthetic.topk_sum import (
    bubble_sort_topk_sum,
    exact_objective,
    heap_sort_topk_sum,
    lambda_iteration,
    sort_topk_sum,
)
from topklab.synthetic.train import BinaryCrossEntropy, Column, SyntheticTrainer, accuracy, train_logistic
from topklab.utils.errors import TopklabError
from topklab.utils.k import resolve_k

# ---------- data ----------


def test_covariances_as_printed_and_intended():
    printed = GaussianTask(d=5, n_signal=2, covariance="printed").cov
    intended = GaussianTask(d=5, n_signal=2, covariance="intended").cov
    for j in range(5):
        for k in range(5):
            assert printed[j, k].item() == pytest.approx(0.25 ** (0.5 + abs(j - k)))
            assert intended[j, k].item() == pytest.approx(0.5 ** abs(j - k))
    assert printed[0, 0].item() == pytest.approx(0.5)  # the printed form's diagonal is 0.5, not 1


def test_samples_have_the_covariance_means_and_exact_class_ratio():
    task = GaussianTask(d=6, n_signal=2, covariance="intended")
    split = task.sample(40_000, positive_fraction=0.8, generator=torch.Generator().manual_seed(1))
    assert int(split.y.sum()) == 32_000 and split.x.dtype == torch.float32
    x = split.x.double()
    for label, mean in ((1, task.mean_pos), (0, task.mean_neg)):
        rows = x[split.y == label]
        torch.testing.assert_close(rows.mean(0), mean, atol=0.03, rtol=0)
        torch.testing.assert_close(torch.cov(rows.T), task.cov, atol=0.04, rtol=0)
    assert task.mean_pos.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("fraction,n,expected", [(0.5, 10, 5), (0.999, 1000, 999), (0.999, 100, 99), (0.001, 100, 1)])
def test_class_counts_round_and_keep_both_classes(fraction, n, expected):
    split = GaussianTask(d=3, n_signal=1).sample(n, fraction, torch.Generator().manual_seed(0))
    assert int(split.y.sum()) == expected


@pytest.mark.parametrize("kwargs", [{"covariance": "diagonal"}, {"rho": 1.0}, {"n_signal": 0}, {"n_signal": 9, "d": 4}])
def test_bad_task_settings_say_what_to_fix(kwargs):
    with pytest.raises(TopklabError):
        GaussianTask(**kwargs)


# ---------- LDA and ParaF1 ----------


def test_lda_boundary_of_the_papers_2d_example():
    task = GaussianTask(d=2, n_signal=2, shift=2.0, rho=0.8)
    w, b = lda_boundary(task.mean_neg, task.mean_pos, task.cov, 0.8)
    assert w.tolist() == pytest.approx([1.111, 1.111], abs=1e-3)
    assert b == pytest.approx(-0.836, abs=1e-3)


def test_lda_boundary_is_the_bayes_rule():
    """The LDA score equals the log posterior odds computed from the two Gaussian densities."""
    task = GaussianTask(d=3, n_signal=2, shift=1.5, rho=0.3)
    w, b = lda_boundary(task.mean_neg, task.mean_pos, task.cov, 0.7)
    x = torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.distributions.MultivariateNormal(task.mean_pos, task.cov).log_prob(x)
    neg = torch.distributions.MultivariateNormal(task.mean_neg, task.cov).log_prob(x)
    torch.testing.assert_close(x @ w + b, pos - neg + torch.log(torch.tensor(0.7 / 0.3, dtype=torch.float64)))


def test_paraf1_against_a_set_based_reference():
    g = torch.Generator().manual_seed(4)
    w_star = torch.zeros(30)
    w_star[:10] = 1.0
    for _ in range(20):
        w_hat = torch.randn(30, generator=g) * (torch.rand(30, generator=g) < 0.4)
        found = {j for j in range(30) if abs(w_hat[j]) > 0.2}
        true = set(range(10))
        hits = len(found & true)
        precision = hits / len(found) if found else 0.0
        recall = hits / len(true)
        want = 2 * precision * recall / (precision + recall) if hits else 0.0
        assert para_f1(w_hat, w_star, 0.2).item() == pytest.approx(want, abs=1e-6)
    assert para_f1(torch.zeros(30), w_star, 0.0).item() == 0.0
    assert para_f1(w_star, w_star, 0.0).item() == 1.0


# ---------- trainers ----------


@pytest.fixture(scope="module")
def tiny_data():
    task = GaussianTask(d=12, n_signal=3, covariance="intended")
    g = torch.Generator().manual_seed(0)
    train = [task.sample(400, 0.8, g) for _ in range(2)]
    val = [task.sample(150, 0.5, g) for _ in range(2)]
    return train, val


COLUMNS = [
    Column("average"),
    Column("maximum"),
    Column("atk"),
    Column("matk"),
    Column("stk"),
    Column("stk", {"smoothing": "elu"}),
    Column("stk", {"smoothing": "softplus"}),
    Column("stk", {"smoothing": "leaky_relu"}),
]


def single_model(column, k, train, val, seed, settings, scale="paper", on_eval=None):
    """One logistic regression the plain way: ``nn.Linear`` under ``manual_seed(seed)``, BCE, the
    column's aggregate module, l1 on the weight, ``torch.optim.Adam`` on the model and λ, early
    stopping with roll-back, through the reference loop of tests/helpers/population.py."""
    from helpers.population import reference_fit

    torch.manual_seed(seed)
    model = torch.nn.Linear(train.x.shape[1], 1)
    fields = {**column.overrides, **({"k": k} if column.uses_k else {})}
    if column.uses_lambda:
        lam_init = settings.lam_init
        if lam_init == "auto":
            batch = min(settings.batch_size, len(train.y))
            with torch.no_grad():
                losses = BinaryCrossEntropy()(model(train.x), train.y)
            lam_init = float(initial_threshold(losses, torch.tensor(float(resolve_k(k, batch))), batch))
        fields.update(lam_init=lam_init, scale=scale)
    aggregate = build_paper_update_aggregate(column.aggregate, **fields)
    optimizer = torch.optim.Adam(
        [*model.parameters(), *aggregate.parameters()], lr=settings.lr, betas=settings.betas, eps=settings.eps
    )
    data = type("Data", (), {"x_train": train.x, "y_train": train.y, "x_val": val.x, "y_val": val.y})
    return reference_fit(
        model,
        BinaryCrossEntropy(),
        aggregate,
        optimizer,
        data,
        seed,
        max_epochs=settings.max_epochs,
        batch_size=settings.batch_size,
        eval_every=settings.eval_every,
        patience=settings.patience,
        min_delta=settings.min_delta,
        metric=accuracy,
        higher_is_better=True,
        l1=settings.l1,
        parts=("val",),
        on_eval=on_eval,
    )


@pytest.mark.parametrize("column", COLUMNS, ids=lambda c: f"{c.aggregate}-{c.overrides.get('smoothing', '')}")
@pytest.mark.parametrize("lam_init", [0.0, "auto"])
def test_population_equals_single_model_loop(tiny_data, column, lam_init):
    train, val = tiny_data
    settings = SyntheticTrainer(
        batch_size=64, lr=1e-2, l1=1e-3, eval_every=5, patience=30, max_epochs=12, lam_init=lam_init
    )
    seeds, ks = [3, 4], [0.5, 0.2, 5]
    population = train_logistic(column, settings, train, val, seeds, ks)
    for r in range(2):
        for m, k in enumerate(ks):
            single = single_model(column, k, train[r], val[r], seeds[r], settings)
            assert single["best_step"] == int(population["best_step"][r, m])
            assert single["steps"] == int(population["steps"][r, m])
            assert single["metrics"]["val"] == pytest.approx(float(population["val_acc"][r, m]), abs=1e-12)
            torch.testing.assert_close(population["w"][r, m], single["model"].weight.detach()[0], atol=1e-5, rtol=1e-4)
            if column.uses_lambda:
                assert float(population["lam"][r, m]) == pytest.approx(single["lambda"], abs=1e-5)
            else:
                assert torch.isnan(population["lam"][r, m])


def test_early_stopping_rolls_back_to_the_best_validation_step(tiny_data):
    train, val = tiny_data
    settings = SyntheticTrainer(batch_size=64, lr=5e-2, eval_every=1, patience=15, max_epochs=50)
    out = train_logistic(Column("average"), settings, train[:1], val[:1], [7], [1])
    assert int(out["steps"]) - int(out["best_step"]) == settings.patience  # stopped patience steps after the best
    w, b = out["w"][0, 0], out["b"][0, 0]
    acc = ((val[0].x @ w + b > 0).float() == val[0].y).double().mean().item()
    assert acc == pytest.approx(float(out["val_acc"]))


def test_column_modules_come_from_the_loss_configs():
    module = Column("stk", {"smoothing": "elu"}).module("atk")
    assert (module.smoothing, module.scale) == ("elu", "atk")
    assert Column("atk").uses_k and not Column("atk").uses_lambda and not Column("average").uses_k


def test_initial_threshold_is_the_kth_largest():
    losses = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.3, 0.2, 0.8, 0.4]])
    # n = 8 rows, batch 4: k = 1 of 4 -> the 2nd largest of 8; k = 3 of 4 -> the 6th largest
    got = initial_threshold(losses.expand(2, 8), torch.tensor([1.0, 3.0]), batch=4)
    assert got.tolist() == pytest.approx([0.8, 0.3])


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"lr": 0.0}, {"l1": -1.0}, {"lam_init": "median"}])
def test_bad_trainer_settings(kwargs):
    with pytest.raises(TopklabError):
        SyntheticTrainer(**kwargs)


# ---------- Table 1 solvers ----------


def test_topk_sum_solvers_agree_with_torch_topk():
    g = torch.Generator().manual_seed(2)
    for n, k in ((50, 5), (301, 1), (400, 400)):
        values = torch.randn(n, generator=g, dtype=torch.float64)
        want = float(torch.topk(values, k).values.sum())
        assert bubble_sort_topk_sum(values.tolist(), k) == pytest.approx(want)
        assert heap_sort_topk_sum(values.tolist(), k) == pytest.approx(want)
        assert sort_topk_sum(values, k) == pytest.approx(want)


@pytest.mark.parametrize("method", ["atk", "stk"])
def test_lambda_iteration_reaches_the_tolerance(method):
    values = torch.randn(5000, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    target = float(torch.topk(values, 5).values.sum())
    answer, iterations = lambda_iteration(values, 5, target, method, tol=1e-2)
    assert abs(answer - target) < 1e-2 and iterations > 0
    # Eq. 1 at any λ bounds the top-k sum from above, and is exact at λ = e_[k]
    kth = torch.topk(values, 5).values[-1]
    assert float(exact_objective(values, kth, 5)) == pytest.approx(target)
    assert float(exact_objective(values, kth + 0.3, 5)) > target


# ---------- scripts end to end ----------

TINY = [
    "repeats=2",
    "threads=1",
    "task.d=12",
    "task.n_signal=3",
    "sizes.train=600",
    "sizes.val=200",
    "sizes.test=200",
    "trainer.batch_size=64",
    "trainer.max_epochs=3",
    "k_grid=[0.2,0.8]",
    "time_repeats=1",
    "figure3.sizes.train=300",
    "figure3.sizes.val=100",
    "figure3.sizes.test=100",
    "figure3.trainer.max_epochs=3",
    "figure4.negative_ratios=[0.5,0.05]",
]


def run_script(name, *args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


@pytest.mark.integration
def test_reproduce_synthetic_then_tables_and_figures(tmp_path):
    results = tmp_path / "results"
    (results / "paper").mkdir(parents=True)
    (results / "paper" / "stk_neurips2024.yaml").write_text((ROOT / "results/paper/stk_neurips2024.yaml").read_text())
    out = run_script("reproduce_synthetic.py", *TINY, f"results_dir={results}/synthetic", f"hydra.run.dir={tmp_path}/h")
    assert out.returncode == 0, out.stderr
    envelope = json.loads((results / "synthetic" / "table2.json").read_text())
    table2 = envelope["result"]
    assert envelope["family"] == "synthetic" and table2["order"][0] == "Average" and len(table2["columns"]) == 9
    for column in table2["columns"].values():
        assert len(column["test_acc"]) == 2 and all(0 <= a <= 100 for a in column["test_acc"])
        assert all(0 <= f <= 1 for f in column["paraf1"] + column["paraf1_paper"])
        assert all(b <= s <= column["step_cap"] for b, s in zip(column["best_step"], column["steps"]))
    assert table2["paper_support"] == [0, 1, 2] and table2["true_support"] == [
        0,
        1,
        2,
        3,
    ]  # Σ⁻¹ spreads the shift one further
    assert table2["columns"]["STk (SReLU), λ₀ = 0"]["trainer"] == {"lam_init": 0.0}
    assert table2["columns"]["STk (SReLU)"]["k"] in (0.2, 0.8) and table2["columns"]["Average"]["k"] is None
    assert envelope["provenance"]["git"] and "repeats=2" in envelope["command"]
    figure4 = json.loads((results / "synthetic" / "figure4.json").read_text())["result"]
    assert set(figure4["by_ratio"]) == {"0.5", "0.05"}

    out = run_script("table1_topk_time.py", "--runs", "2", "--n", "300", "--out", str(results / "bench/table1.json"))
    assert out.returncode == 0, out.stderr
    table1 = json.loads((results / "bench" / "table1.json").read_text())["result"]
    assert all(max(row["abs_error"]) < 1e-2 for row in table1["algorithms"].values())

    out = run_script("make_tables.py", "--results", str(results), "--allow-dirty")  # a developer's tree may be dirty
    assert out.returncode == 2 and "no cells" in out.stderr  # no tabular cells in this tree: a one-line error
    out = run_script("make_figures.py", "--results", str(results))
    assert out.returncode == 0, out.stderr
    for name in ("figure2", "figure3", "figure4"):
        assert (results / "figures" / f"{name}.png").stat().st_size > 10_000


def test_table1_script_rejects_bad_input(tmp_path):
    out = run_script("table1_topk_time.py", "--k", "0", "--out", str(tmp_path / "t.json"))
    assert out.returncode == 2 and out.stderr.startswith("error:") and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "t.json").exists()


def test_reproduce_synthetic_rejects_unknown_experiment(tmp_path):
    out = run_script(
        "reproduce_synthetic.py", "experiments=[table9]", f"results_dir={tmp_path}/r", f"hydra.run.dir={tmp_path}/h"
    )
    assert out.returncode == 2 and "unknown synthetic experiment" in out.stderr
    assert not (tmp_path / "r").exists()


def test_synthetic_columns_are_experiment_rows_and_unknown_ones_fail_in_one_line(tmp_path):
    out = run_script(
        "reproduce_synthetic.py",
        "experiments=[table2]",
        "table2.columns=[stk/table2/nope]",
        f"results_dir={tmp_path}/r",
        f"hydra.run.dir={tmp_path}/h",
    )
    assert out.returncode == 2 and not (tmp_path / "r").exists()
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: synthetic column 'stk/table2/nope'"), out.stderr


FIGURE3 = ["experiments=[figure3]", "repeats=1", *[s for s in TINY if s.startswith("figure3.")]]


@pytest.mark.integration
def test_a_stored_synthetic_file_is_kept_refused_checked_or_replaced(tmp_path):
    """Rerun under an equal identity: reproduced bit for bit, the file kept as it is; under another config:
    one line, nothing run; check_result: written aside and compared; force_result: replaced, recorded."""
    results, own = tmp_path / "synthetic", tmp_path / "own"
    where = [f"results_dir={results}", f"hydra.run.dir={tmp_path}/h", f"check_dir={own}"]
    assert run_script("reproduce_synthetic.py", *FIGURE3, *where).returncode == 0
    stored = (results / "figure3.json").read_bytes()
    again = run_script("reproduce_synthetic.py", *FIGURE3, *where)
    assert "reproduces" in again.stdout and "bit for bit" in again.stdout, again.stdout + again.stderr
    assert (results / "figure3.json").read_bytes() == stored and not own.exists()
    other = [*FIGURE3, "figure3.trainer.max_epochs=2", *where]
    refused = run_script("reproduce_synthetic.py", *other)
    lines = refused.stderr.strip().splitlines()
    assert (
        refused.returncode == 2 and len(lines) == 1 and "other settings (config figure3.trainer.max_epochs)" in lines[0]
    )
    checked = run_script("reproduce_synthetic.py", *other, "check_result=true")
    assert checked.returncode == 0 and (own / "figure3.json").is_file(), checked.stderr
    assert json.loads((own / "figure3.json").read_text())["result"]["compared_with"]["path"] == str(
        results / "figure3.json"
    )
    assert (results / "figure3.json").read_bytes() == stored
    assert run_script("reproduce_synthetic.py", *other, "force_result=true").returncode == 0
    replaced = json.loads((results / "figure3.json").read_text())
    assert replaced["config"]["figure3"]["trainer"]["max_epochs"] == 2 and replaced["result"]["replaced"]["identity"]


def test_the_committed_synthetic_files_are_refused_before_anything_runs(tmp_path):
    committed = ROOT / "results" / "synthetic" / "figure3.json"
    before = committed.read_bytes()
    out = subprocess.run(
        [sys.executable, "train.py", "experiment=stk/synthetic/figure3", f"hydra.run.dir={tmp_path}/run",
         f"paths.log_dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "WANDB_MODE": "disabled"},
    )  # fmt: skip
    lines = out.stderr.strip().splitlines()
    assert (
        out.returncode == 2 and len(lines) == 1 and f"{committed} holds a result with other settings (code " in lines[0]
    )
    assert committed.read_bytes() == before
