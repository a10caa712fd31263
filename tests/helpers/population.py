"""The plain per-model references of the population executor (``engine/test_population.py``), also used by
``protocol/test_protocol.py`` (a selected cell retrained model by model) and ``synthetic/test_synthetic.py``."""

import copy

import torch

from topklab.losses import ATk, Average, MATk, Maximum, STk
from topklab.models import MLP
from topklab.tasks.metrics import TASK_METRIC

SINGLE = {
    "average": lambda k, d: Average(),
    "maximum": lambda k, d: Maximum(),
    "atk": lambda k, d: ATk(k),
    "matk": lambda k, d: MATk(k, lam_update="gradient", lam_init=0.0),
    "stk": lambda k, d: STk(k, delta=d, lam_update="gradient", lam_init=0.0),
}


def reference_fit(
    model,
    individual,
    aggregate,
    optimizer,
    data,
    seed,
    *,
    max_epochs,
    batch_size,
    eval_every,
    patience,
    min_delta,
    metric,
    higher_is_better=False,
    l2_C=None,
    l1=0.0,
    parts=("train", "val", "test"),
    on_eval=None,
    restore_best=True,
):
    """The obvious loop: one model, ``torch.optim``, batches from ``randperm`` of a generator seeded
    with ``seed`` (last incomplete batch dropped), validation every ``eval_every`` steps, a strict
    ``> best + min_delta`` improvement keeps a copy of model and λ, stop ``patience`` steps after the
    best, stop on a non-finite objective, roll back to the best copy (unless ``restore_best`` is false),
    score it."""
    params = list(model.parameters())
    sign = 1.0 if higher_is_better else -1.0

    def score() -> float:
        with torch.no_grad():
            return sign * float(metric(model(data.x_val), data.y_val))

    def snapshot():
        return copy.deepcopy(model.state_dict()), copy.deepcopy(aggregate.state_dict())

    generator = torch.Generator().manual_seed(seed)
    n = len(data.y_train)
    best_score, best_step, best = score(), 0, snapshot()
    step, diverged, stopped = 0, False, False
    for _epoch in range(max_epochs):
        order = torch.randperm(n, generator=generator)
        for b in range(max(1, n // batch_size)):
            idx = order[b * batch_size : (b + 1) * batch_size]
            objective = aggregate(individual(model(data.x_train[idx]), data.y_train[idx]))
            if l2_C is not None:
                objective = objective + sum(p.square().sum() for p in params) / (2.0 * l2_C)
            if l1:
                objective = objective + l1 * sum(p.abs().sum() for p in params if p.dim() > 1)
            if not torch.isfinite(objective):
                diverged = stopped = True
                break
            optimizer.zero_grad()
            objective.backward()
            optimizer.step()
            step += 1
            if step % eval_every == 0:
                value = score()
                if on_eval is not None:
                    on_eval(step, value)
                if value > best_score + min_delta:
                    best_score, best_step, best = value, step, snapshot()
                if step - best_step >= patience:
                    stopped = True
                    break
        if stopped:
            break
    if restore_best:
        model.load_state_dict(best[0])
        aggregate.load_state_dict(best[1])
    with torch.no_grad():
        metrics = {part: float(metric(model(getattr(data, f"x_{part}")), getattr(data, f"y_{part}"))) for part in parts}
    threshold = getattr(aggregate, "threshold", None)
    return {
        "metrics": metrics,
        "best_step": best_step,
        "steps": step,
        "diverged": diverged,
        "model": model,
        "lambda": None if threshold is None else float(threshold.detach()),
        "lam_last": float(aggregate.lam_last) if hasattr(aggregate, "lam_last") else None,
    }


def per_model(aggregate, individual, splits, seed, k, lr, C, delta, make=None, **trainer_kwargs):
    """One tabular member the plain way: the MLP under ``manual_seed(seed)``, AdaGrad on it and λ
    (``make(k, delta)`` builds the aggregate; default: the paper's update, :data:`SINGLE`)."""
    torch.manual_seed(seed)
    model, loss = MLP(splits.n_features), (make or SINGLE[aggregate])(k, delta)
    optimizer = torch.optim.Adagrad([*model.parameters(), *loss.parameters()], lr=lr)
    name, metric = TASK_METRIC[splits.task]
    out = reference_fit(
        model,
        individual,
        loss,
        optimizer,
        splits,
        seed,
        metric=metric,
        l2_C=None if C == float("inf") else C,
        **trainer_kwargs,
    )
    out["metrics"] = {part: {name: value} for part, value in out["metrics"].items()}
    return out
