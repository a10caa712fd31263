"""Population training: P independent 2-layer MLPs (or linear models), each with its own data
split, seed, hyperparameters (k, C, η, δ), λ, AdaGrad state and early-stopping state, trained in
lockstep as batched tensors. A member that stops leaves the active set, so it costs nothing more.

Member m reproduces ``TabularTrainer`` run alone with ``seed = seeds[m]`` on ``splits[split[m]]``
with AdaGrad(lr[m]), the same initialisation, batch order, early stopping and roll-back
(tests/test_population.py checks this against the per-model loop).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from topklab.losses.k import resolve_k, validate_k
from topklab.models import MLP, Linear
from topklab.population.aggregates import BATCHED_AGGREGATES, USES_LAMBDA
from topklab.train.metrics import TASK_METRIC
from topklab.utils.batching import batches_per_epoch

ADAGRAD_EPS = 1e-10  # torch.optim.Adagrad's default


@dataclass
class Members:
    """Per-member settings, all of length P. ``l2_C`` may hold ``inf`` for "no regulariser"."""

    split: list[int]
    seed: list[int]
    k: list[int | float]
    lr: list[float]
    l2_C: list[float]
    delta: list[float]

    def __post_init__(self):
        lengths = {len(v) for v in (self.split, self.seed, self.k, self.lr, self.l2_C, self.delta)}
        if len(lengths) != 1:
            raise ValueError(f"all member fields must have the same length, got lengths {sorted(lengths)}")
        for k in self.k:
            validate_k(k)

    def __len__(self) -> int:
        return len(self.split)


class PopulationTrainer:
    """Parameters as in :class:`topklab.train.tabular.TabularTrainer`, plus

    aggregate : {"average", "maximum", "atk", "matk", "stk"}
    individual : per-sample loss module (elementwise, e.g. :class:`topklab.losses.Logistic`)
    hidden : int or None, hidden units of the MLP (None = linear model)
    lam_init : float, initial λ (MATk/STk)
    """

    def __init__(self, aggregate: str, individual: nn.Module, hidden: int | None = 10, max_epochs: int = 200,
                 batch_size: int = 16, eval_every: int = 1, patience: int = 50, min_delta: float = 1e-6,
                 drop_last: bool = True, lam_init: float = 0.0, dtype: torch.dtype = torch.float32):
        if aggregate not in BATCHED_AGGREGATES:
            raise ValueError(f"unknown aggregate {aggregate!r}; choose one of: {', '.join(sorted(BATCHED_AGGREGATES))}")
        self.aggregate = aggregate
        self.individual = individual
        self.hidden = hidden
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.eval_every = eval_every
        self.patience = patience
        self.min_delta = min_delta
        self.drop_last = drop_last
        self.lam_init = lam_init
        self.dtype = dtype

    # ---- model as stacked tensors -------------------------------------------------------
    def init_params(self, members: Members, n_features: int) -> dict[str, torch.Tensor]:
        """Stack each member's model as ``torch.manual_seed(seed)`` then the module constructor
        would build it, so that member m starts where the single-model run starts."""
        seeds, member_seed = torch.unique(torch.as_tensor(members.seed), return_inverse=True)
        layers = []
        with torch.random.fork_rng():
            for seed in seeds.tolist():
                torch.manual_seed(seed)
                model = MLP(n_features, self.hidden) if self.hidden else Linear(n_features)
                layers.append([p.detach() for p in model.parameters()])
        names = ["w1", "b1", "w2", "b2"] if self.hidden else ["w2", "b2"]
        params = {name: torch.stack([ps[i] for ps in layers]).to(self.dtype)[member_seed]
                  for i, name in enumerate(names)}
        params["lam"] = torch.full((len(members),), float(self.lam_init), dtype=self.dtype)
        return params

    def forward(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        """Each member on its own inputs: x (P, n, d) -> (P, n, 1)."""
        if "w1" in params:
            x = torch.relu(torch.baddbmm(params["b1"][:, None, :], x, params["w1"].transpose(1, 2)))
        return torch.baddbmm(params["b2"][:, None, :], x, params["w2"].transpose(1, 2))

    def forward_shared(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        """All members on the same inputs, without copying them: x (n, d) -> (P, n, 1).
        One (n, d) @ (d, P·H) product, so the hidden layers of all members come from one GEMM."""
        n, d = x.shape
        members = params["b2"].shape[0]
        if "w1" in params:
            hidden = params["w1"].shape[1]
            h = torch.addmm(params["b1"].reshape(-1), x, params["w1"].reshape(-1, d).t()).relu_()
            out = (h.view(n, members, hidden) * params["w2"][:, 0, :]).sum(-1).t()
        else:
            out = (x @ params["w2"][:, 0, :].t()).t()
        return (out + params["b2"]).unsqueeze(-1)

    def metric_by_split(self, metric, params: dict, member_split: torch.Tensor, x: torch.Tensor,
                        y: torch.Tensor, chunk: int) -> torch.Tensor:
        """``metric`` of every member (rows of ``params``) on its own split of (x, y): (S, n, d)."""
        out = torch.empty(len(member_split), dtype=torch.float64)
        with torch.no_grad():
            for s in torch.unique(member_split).tolist():
                rows = torch.nonzero(member_split == s).flatten()
                for c in rows.split(chunk):
                    out[c] = metric(self.forward_shared({n: t[c] for n, t in params.items()}, x[s]), y[s]).double()
        return out

    # ---- training -----------------------------------------------------------------------
    def fit(self, splits: list, members: Members, chunk: int = 4096,
            on_retire: Callable[[int], None] | None = None) -> dict[str, torch.Tensor]:
        """Train every member; return per-member tensors: ``{train,val,test}_<metric>``,
        ``best_step``, ``steps``, ``lambda``, ``diverged``. ``on_retire(n)`` is called whenever
        ``n`` members finish (for progress bars)."""
        task = splits[0].task
        metric_name, metric = TASK_METRIC[task]
        xtr = torch.stack([s.x_train for s in splits]).to(self.dtype)
        ytr = torch.stack([s.y_train for s in splits]).to(self.dtype)
        xva = torch.stack([s.x_val for s in splits]).to(self.dtype)
        yva = torch.stack([s.y_val for s in splits]).to(self.dtype)
        n_train = xtr.shape[1]
        per_epoch = batches_per_epoch(n_train, self.batch_size, self.drop_last)
        P = len(members)

        split = torch.as_tensor(members.split)
        seeds, seed_group = torch.unique(torch.as_tensor(members.seed), return_inverse=True)
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        lr = torch.as_tensor(members.lr, dtype=self.dtype)
        inv_2c = 1.0 / (2.0 * torch.as_tensor(members.l2_C, dtype=self.dtype))
        delta = torch.as_tensor(members.delta, dtype=self.dtype)
        counts: dict[int, torch.Tensor] = {}

        def k_counts(batch: int) -> torch.Tensor:
            if batch not in counts:
                counts[batch] = torch.as_tensor([resolve_k(k, batch) for k in members.k], dtype=self.dtype)
            return counts[batch]

        params = self.init_params(members, xtr.shape[2])
        trained = [n for n in params if n != "lam" or self.aggregate in USES_LAMBDA]
        best = {n: t.clone() for n, t in params.items()}

        def val_score(p: dict, ids: torch.Tensor) -> torch.Tensor:
            return -self.metric_by_split(metric, p, split[ids], xva, yva, chunk)

        active = torch.arange(P)  # ids of the members still training
        best_score = val_score(params, active)
        best_step = torch.zeros(P, dtype=torch.long)
        steps = torch.zeros(P, dtype=torch.long)
        diverged = torch.zeros(P, dtype=torch.bool)
        cur = params
        opt_state = {n: torch.zeros_like(params[n]) for n in trained}
        step = 0

        def retire(keep: torch.Tensor) -> None:
            nonlocal active, cur, opt_state
            if on_retire is not None:
                on_retire(int((~keep).sum()))
            active = active[keep]
            cur = {n: t[keep] for n, t in cur.items()}
            opt_state = {n: t[keep] for n, t in opt_state.items()}

        for _epoch in range(self.max_epochs):
            if len(active) == 0:
                break
            orders = torch.stack([torch.randperm(n_train, generator=g) for g in generators])
            for b in range(per_epoch):
                sl = slice(b * self.batch_size, (b + 1) * self.batch_size)
                pos = orders[seed_group[active], sl]                     # (A, B)
                rows = split[active][:, None]
                xb, yb = xtr[rows, pos], ytr[rows, pos]
                batch = pos.shape[1]
                k = k_counts(batch)[active]
                leaves = {n: cur[n].detach().requires_grad_(n in trained) for n in cur}
                losses = self.individual(self.forward(leaves, xb), yb)
                objective = BATCHED_AGGREGATES[self.aggregate](losses, k, leaves["lam"], delta[active])
                model_sq = sum(leaves[n].square().flatten(1).sum(1) for n in leaves if n != "lam")
                objective = objective + inv_2c[active] * model_sq
                finite = torch.isfinite(objective)
                grads = torch.autograd.grad(objective.sum(), [leaves[n] for n in trained])
                step += 1
                with torch.no_grad():
                    lr_a = lr[active]
                    for n, g in zip(trained, grads):
                        shape = (-1,) + (1,) * (g.dim() - 1)
                        opt_state[n].addcmul_(g, g)
                        cur[n] = leaves[n].detach() - lr_a.view(shape) * g / (opt_state[n].sqrt() + ADAGRAD_EPS)
                steps[active] = step
                stop = ~finite
                diverged[active[stop]] = True
                steps[active[stop]] = step - 1
                if step % self.eval_every == 0:
                    score = val_score(cur, active)
                    improved = (score > best_score[active] + self.min_delta) & finite
                    ids = active[improved]
                    best_score[ids] = score[improved]
                    best_step[ids] = step
                    for n in best:
                        best[n][ids] = cur[n][improved]
                    stop |= (step - best_step[active]) >= self.patience
                if stop.any():
                    retire(~stop)
                    if len(active) == 0:
                        break
        if on_retire is not None and len(active):
            on_retire(len(active))
        return self._final_metrics(best, best_step, steps, diverged, splits, split, metric_name, metric, chunk)

    def _final_metrics(self, best, best_step, steps, diverged, splits, split, metric_name, metric, chunk):
        result = {"best_step": best_step, "steps": steps, "diverged": diverged, "lambda": best["lam"].clone()}
        for part in ("train", "val", "test"):
            x = torch.stack([getattr(s, f"x_{part}") for s in splits]).to(self.dtype)
            y = torch.stack([getattr(s, f"y_{part}") for s in splits]).to(self.dtype)
            result[f"{part}_{metric_name}"] = self.metric_by_split(metric, best, split, x, y, chunk)
        return result
