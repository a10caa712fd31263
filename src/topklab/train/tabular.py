"""Mini-batch training of one tabular model with step-level early stopping and roll-back."""
from __future__ import annotations

import copy
import time
from typing import Callable

import torch
from torch import nn

from topklab.train.metrics import evaluate
from topklab.utils.batching import batches_per_epoch
from topklab.utils.errors import NonFiniteLossError


def trainable_parameters(model: nn.Module, aggregate: nn.Module) -> list[nn.Parameter]:
    """Model parameters plus the aggregate loss's own (λ of MATk/STk): both go to the optimizer."""
    return [p for p in (*model.parameters(), *aggregate.parameters()) if p.requires_grad]


def l2_penalty(model: nn.Module, C: float | None) -> torch.Tensor | float:
    """The paper's regulariser Ω(w) = 1/(2C)·‖w‖² over all model parameters (0 when C is None)."""
    if C is None:
        return 0.0
    return sum(p.square().sum() for p in model.parameters()) / (2.0 * C)


class TabularTrainer:
    """Trains ``model`` on ``aggregate(individual(model(x), y))`` + Ω(w) in mini-batches.

    Validation is scored every ``eval_every`` steps; training stops once the validation score
    has not improved by more than ``min_delta`` for ``patience`` steps (the STk paper: 1e-6 over
    50 steps) or after ``max_epochs``, and the best-validation state (model and λ) is restored.

    Parameters
    ----------
    max_epochs : int >= 1
    batch_size : int >= 1 (paper: 16)
    eval_every : int >= 1, steps between validation evaluations
    patience : int >= 1, steps without improvement before stopping
    min_delta : float >= 0, the smallest change that counts as an improvement
    l2_C : float > 0 or None, C of Ω(w) = 1/(2C)·‖w‖²; None disables it
    drop_last : bool, drop the last incomplete batch of each epoch
    """

    def __init__(
        self,
        max_epochs: int = 200,
        batch_size: int = 16,
        eval_every: int = 1,
        patience: int = 50,
        min_delta: float = 1e-6,
        l2_C: float | None = None,
        drop_last: bool = True,
    ):
        for name, value in (("max_epochs", max_epochs), ("batch_size", batch_size),
                            ("eval_every", eval_every), ("patience", patience)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"trainer.{name}={value!r} must be an int >= 1")
        if min_delta < 0:
            raise ValueError(f"trainer.min_delta={min_delta} must be >= 0")
        if l2_C is not None and not l2_C > 0:
            raise ValueError(f"trainer.l2_C={l2_C} must be > 0 (or null for no regulariser)")
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.eval_every = eval_every
        self.patience = patience
        self.min_delta = min_delta
        self.l2_C = l2_C
        self.drop_last = drop_last

    def fit(
        self,
        model: nn.Module,
        individual: nn.Module,
        aggregate: nn.Module,
        optimizer: torch.optim.Optimizer,
        splits,
        generator: torch.Generator,
        on_epoch_end: Callable[[dict], None] = lambda row: None,
        on_eval: Callable[[dict], None] = lambda row: None,
        workdir=None,
        run_dir=None,
        logger_id=None,
    ) -> dict:
        """Train, roll back to the best-validation state, and score it. ``workdir``, ``run_dir``
        and ``logger_id`` are the engine's resume arguments; a tabular run takes seconds and is
        not checkpointed, so they are unused here."""
        task = splits.task
        x, y = splits.x_train, splits.y_train
        n = len(y)
        per_epoch = batches_per_epoch(n, self.batch_size, self.drop_last)

        def snapshot() -> dict:
            return {"model": copy.deepcopy(model.state_dict()), "loss": copy.deepcopy(aggregate.state_dict())}

        def validate() -> dict:
            model.eval()
            with torch.no_grad():
                result = evaluate(task, model(splits.x_val), splits.y_val)
            model.train()
            return result

        val = validate()
        best = {"score": val["score"], "step": 0, "state": snapshot(), "val": val}
        step, start, stopped = 0, time.perf_counter(), False
        model.train()
        for epoch in range(1, self.max_epochs + 1):
            order = torch.randperm(n, generator=generator)
            epoch_loss = 0.0
            for b in range(per_epoch):
                idx = order[b * self.batch_size : (b + 1) * self.batch_size]
                objective = aggregate(individual(model(x[idx]), y[idx])) + l2_penalty(model, self.l2_C)
                if not torch.isfinite(objective):
                    raise NonFiniteLossError(
                        f"non-finite loss ({float(objective.detach())}) at epoch {epoch}, step {step + 1}; "
                        f"lower optim.lr or check the data",
                        last_good_state=snapshot(),
                    )
                optimizer.zero_grad(set_to_none=True)
                objective.backward()
                optimizer.step()
                step += 1
                epoch_loss += float(objective.detach())
                if step % self.eval_every == 0:
                    val = validate()
                    if val["score"] > best["score"] + self.min_delta:
                        best = {"score": val["score"], "step": step, "state": snapshot(), "val": val}
                    on_eval({"step": step, "epoch": epoch, **{f"val_{k}": v for k, v in val.items()},
                             "lambda": lambda_of(aggregate)})
                    if step - best["step"] >= self.patience:
                        stopped = True
                        break
            on_epoch_end({
                "epoch": epoch, "step": step, "train_objective": epoch_loss / max(b + 1, 1),
                **{f"val_{k}": v for k, v in (val if step % self.eval_every == 0 else validate()).items()},
                "lambda": lambda_of(aggregate),
                "best_step": best["step"], "elapsed_s": time.perf_counter() - start,
            })
            if stopped:
                break
        model.load_state_dict(best["state"]["model"])
        aggregate.load_state_dict(best["state"]["loss"])
        model.eval()
        with torch.no_grad():
            metrics = {
                split: evaluate(task, model(xs), ys)
                for split, xs, ys in (("train", x, y), ("val", splits.x_val, splits.y_val),
                                      ("test", splits.x_test, splits.y_test))
            }
        return {
            "metrics": metrics, "best_step": best["step"], "steps": step, "epochs": epoch,
            "early_stopped": stopped, "lambda": lambda_of(aggregate), "train_seconds": time.perf_counter() - start,
        }


def lambda_of(aggregate: nn.Module) -> float | None:
    threshold = getattr(aggregate, "threshold", None)
    return None if threshold is None else float(threshold.detach())
