"""Token routers for Mixture-of-Depths blocks: which tokens of a sequence a block processes.

Every router scores each token with one linear map of the LayerNorm-ed token, ``s_i = w·LN(x_i) + b``
(``input_norm``: the scores keep a fixed scale while the residual stream grows, so a threshold on
them stays meaningful), and gates a routed token's block update by ``σ(s_i)`` (so the router gets a
gradient from the task); they differ in the rule that selects the tokens (Raposo et al. 2024,
"Mixture-of-Depths"; the gate and the normalisation are ours, see docs/choices.md):

- :class:`TopKRouter`: in training, the round(c·N) highest-scoring of the batch's N real tokens
  (``scope="batch"``, so the routed share is c over the batch) or each sequence's ⌈c·L⌉ (MoD's
  ``scope="sequence"``). That choice depends on later tokens; at inference a causal predictor
  decides instead (MoD's auxiliary predictor: a linear map of the detached router input, trained by
  binary cross-entropy to tell whether a token is selected).
- :class:`ProbabilityThresholdRouter`: tokens with ``σ(s_i) > p`` (MoDification's threshold-p).
  Causal; nothing holds the fraction routed near a target.
- :class:`STkThresholdRouter`: tokens with ``s_i > λ``, λ the STk threshold of the scores with
  k/n = c (Xia et al. 2024, Eq. 6): by default solved per training batch (Σ SReLU'_δ(s_i − λ) = c·n,
  sort-free) with a running average for inference; or a trainable scalar (the paper's update).
  Causal: λ is a fixed number at inference.

``router(x, real) -> (selected, gate)`` with ``x`` (B, L, d), ``real`` (B, L) bool; after a call,
``router.auxiliary_loss`` holds the term the training objective adds. Each router counts the tokens
it routed in training (:meth:`TokenRouter.pop_training_fraction`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from topklab.losses.aggregate.lambda_rules import HoldsRule, LambdaRule, Solved, mark_started, rule_for
from topklab.smoothing import srelu

SCOPES = ("batch", "sequence")
INFERENCE = ("predictor", "top_k")


def _capacity(value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError(f"router.capacity={value} must lie in (0, 1]")
    return float(value)


class TokenRouter(nn.Module):
    """Shared part: the (normalised) linear score, the σ gate and the training counters."""

    def __init__(self, dim: int, input_norm: bool = True):
        super().__init__()
        self.norm = nn.LayerNorm(dim) if input_norm else nn.Identity()
        self.score = nn.Linear(dim, 1)  # PyTorch's default init: a zero router would route nothing past a threshold
        self.auxiliary_loss = torch.zeros(())
        self._routed = self._real = None

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        return self.score(self.norm(x)).squeeze(-1).float()

    def select(self, x: torch.Tensor, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.scores(x)
        selected = self.select(x, scores, real) & real
        if self.training:
            routed, count = selected.sum().double(), real.sum().double()
            self._routed = routed if self._routed is None else self._routed + routed
            self._real = count if self._real is None else self._real + count
        return selected, torch.sigmoid(scores)

    def pop_training_fraction(self) -> float | None:
        """The share of real tokens routed in training since the last call (one synchronisation)."""
        if self._routed is None:
            return None
        fraction = float(self._routed / self._real.clamp(min=1))
        self._routed = self._real = None
        return fraction


class TopKRouter(TokenRouter):
    """The highest scores: round(c·N) of the batch's N real tokens (``scope="batch"``) or ⌈c·L_b⌉ of
    each sequence b (``scope="sequence"``, MoD's rule, which routes more than c of short sentences);
    ties go to the earlier position. At inference (``inference="predictor"``, the default) a causal
    predictor selects instead: ``v·sg(LN(x_i)) + a > 0``, trained on the auxiliary term
    ``BCE(v·sg(LN(x)) + a, selected)`` over the real tokens (MoD's auxiliary predictor, §3.5).

    Parameters
    ----------
    dim : int, model width (given by the model)
    capacity : float in (0, 1], the fraction of tokens the block processes
    scope : {"batch", "sequence"}, where the top-k is taken in training
    inference : {"predictor", "top_k"}, the selection outside training: the causal predictor, or the
        top-k itself (not causal: token-by-token decoding cannot make it)
    input_norm : bool, LayerNorm on the router input

    Examples
    --------
    >>> router = TopKRouter(dim=4, capacity=0.5)
    >>> selected, gate = router(torch.randn(2, 6, 4), torch.ones(2, 6, dtype=torch.bool))
    >>> int(selected.sum()), router.pop_training_fraction()   # half of the batch's 12 tokens
    (6, 0.5)
    """

    def __init__(
        self,
        dim: int,
        capacity: float = 0.125,
        scope: str = "batch",
        inference: str = "predictor",
        input_norm: bool = True,
    ):
        super().__init__(dim, input_norm)
        self.capacity = _capacity(capacity)
        if scope not in SCOPES:
            raise ValueError(f"router.scope={scope!r}; choose one of {', '.join(SCOPES)}")
        if inference not in INFERENCE:
            raise ValueError(f"router.inference={inference!r}; choose one of {', '.join(INFERENCE)}")
        self.scope, self.inference = scope, inference
        self.predictor = nn.Linear(dim, 1) if inference == "predictor" else None

    @property
    def causal(self) -> bool:
        return self.inference == "predictor"

    def select(self, x: torch.Tensor, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        if not self.training and self.predictor is not None:
            return self.predictor(self.norm(x).detach()).squeeze(-1) > 0
        selected = self.top_k(scores, real)
        if self.training and self.predictor is not None:
            logits = self.predictor(self.norm(x).detach()).squeeze(-1).float()
            self.auxiliary_loss = nn.functional.binary_cross_entropy_with_logits(logits[real], selected[real].float())
        return selected

    def top_k(self, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        masked = scores.detach().masked_fill(~real, -math.inf)
        if self.scope == "sequence":
            counts = torch.ceil(self.capacity * real.sum(1)).long()
            ranked = masked.argsort(dim=1, descending=True, stable=True)
            rank = torch.empty_like(ranked).scatter_(
                1, ranked, torch.arange(scores.shape[1], device=scores.device).expand_as(ranked)
            )
            return rank < counts[:, None]
        count = int(torch.round(self.capacity * real.sum()))
        order = masked.flatten().argsort(descending=True, stable=True)[:count]
        return (
            torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
            .index_fill_(0, order, True)
            .view_as(scores)
        )


class ProbabilityThresholdRouter(TokenRouter):
    """Tokens whose gate ``σ(s_i)`` exceeds a fixed probability p (MoDification's threshold-p).

    Parameters
    ----------
    dim : int, model width (given by the model)
    probability : float in (0, 1), the gate a token needs to be processed (higher = fewer tokens)

    Examples
    --------
    >>> router = ProbabilityThresholdRouter(dim=4, probability=0.5)
    >>> _ = router.score.weight.data.zero_(), router.score.bias.data.fill_(1.0)
    >>> router(torch.zeros(1, 3, 4), torch.ones(1, 3, dtype=torch.bool))[0].tolist()
    [[True, True, True]]
    """

    causal = True

    def __init__(self, dim: int, probability: float = 0.5, input_norm: bool = True):
        super().__init__(dim, input_norm)
        if not 0 < probability < 1:
            raise ValueError(f"router.probability={probability} must lie in (0, 1)")
        self.probability = float(probability)

    def select(self, x: torch.Tensor, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(scores) > self.probability


class STkThresholdRouter(HoldsRule, TokenRouter):
    """Tokens scoring above the STk threshold λ of the scores at k/n = ``capacity``.

    λ minimises the STk loss of the batch's real scores (Eq. 6 of Xia et al. 2024 with k/n = c)::

        A(λ) = (1/n) Σ_i SReLU_δ(s_i − λ) + c·λ,     ∂A/∂λ = c − (1/n) Σ_i SReLU'_δ(s_i − λ)

    so a smoothed fraction c of the tokens lies above it. ``lam_update="solve"`` (the default) finds
    that root on every training batch (``solve_steps`` warm-started safeguarded steps, sort-free;
    :func:`~topklab.losses.aggregate.solve.solve_srelu_threshold`) and keeps a running average of it
    (momentum ``lam_momentum``) for inference, as BatchNorm keeps its statistics: the routed share is
    c in training and stays causal at inference. ``lam_update="gradient"`` makes λ a parameter trained
    on A by the optimizer (the paper's update; under Adam λ moves about its learning rate per step,
    slower than the scores it must follow: the ablation row).

    Parameters
    ----------
    dim : int, model width (given by the model)
    capacity : float in (0, 1], the target fraction of tokens processed
    delta : float > 0, SReLU width δ in score units (smaller = a sharper count; the paper's 0.01)
    lam_update : a rule name of :mod:`~topklab.losses.aggregate.lambda_rules` ("solve", "track", "adaptive",
        "gradient") or a rule; None (default): "solve", see above
    lam_init : float or "auto", λ's first value (the first warm start under "solve"); ``auto``: the
        (1 − c)-quantile of the first training batch's scores (per process). Not given by the paper.
    lam_lr : float > 0 or None, "gradient" only: λ's constant learning rate in its own parameter group
        (without weight decay, left out of the schedule); None: the optimizer's rate and schedule.
    solve_steps : int >= 1, lam_momentum : float in (0, 1], rules that store λ only (None: the rule's, 2 and 0.1)
    input_norm : bool, LayerNorm on the router input

    Examples
    --------
    >>> _ = torch.manual_seed(0)
    >>> router = STkThresholdRouter(dim=4, capacity=0.25)
    >>> selected, gate = router(torch.randn(4, 16, 4), torch.ones(4, 16, dtype=torch.bool))
    >>> abs(router.pop_training_fraction() - 0.25) <= 2 / 64   # the solved λ lets a quarter through
    True
    >>> paper = STkThresholdRouter(dim=4, capacity=0.25, lam_update="gradient", lam_init=0.0)
    >>> _ = paper.score.weight.data.zero_(), paper.score.bias.data.zero_()
    >>> _ = paper(torch.randn(2, 8, 4), torch.ones(2, 8, dtype=torch.bool))
    >>> paper.auxiliary_loss.backward(); paper.lam.grad.item()   # all scores 0 = λ: half pass smoothly
    -0.25
    """

    causal = True

    def __init__(
        self,
        dim: int,
        capacity: float = 0.125,
        delta: float = 0.01,
        lam_update: str | LambdaRule | None = None,
        lam_init: float | str = "auto",
        lam_lr: float | None = None,
        solve_steps: int | None = None,
        lam_momentum: float | None = None,
        input_norm: bool = True,
    ):
        super().__init__(dim, input_norm)
        self.capacity = _capacity(capacity)
        if not delta > 0:
            raise ValueError(f"router.delta={delta} must be > 0")
        if lam_init != "auto" and not (isinstance(lam_init, (int, float)) and math.isfinite(lam_init)):
            raise ValueError(f"router.lam_init={lam_init!r} must be a finite number or 'auto'")
        try:
            given = {"solve_steps": solve_steps, "lam_momentum": lam_momentum, "lam_lr": lam_lr}
            self.rule = rule_for(
                Solved.name if lam_update is None else lam_update,
                **{name: value for name, value in given.items() if value is not None},
            )
        except ValueError as error:
            raise ValueError(f"router.{error}") from None
        if not self.rule.stored and lam_lr is not None and not lam_lr > 0:
            raise ValueError(f"router.lam_lr={lam_lr} must be > 0 (null: the optimizer's rate)")
        self.delta, self.lam_init = float(delta), lam_init
        start = torch.tensor(0.0 if lam_init == "auto" else float(lam_init))
        if self.rule.stored:
            self.register_buffer("lam", start.clone())  # the running average: λ at inference
            self.register_buffer("lam_last", start.clone())  # the last batch's λ: the warm start
        else:
            self.lam = nn.Parameter(start)
        self.register_buffer("lam_started", torch.tensor(False))  # in the checkpoint: a resume keeps λ
        self._started = False  # its host copy

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._started = bool(self.lam_started)

    smoothing, kernel, rows = "srelu", "auto", None  # what λ's rule reads of its holder

    def path_for(self, scores: torch.Tensor) -> str:
        return "eager"

    def select(self, x: torch.Tensor, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        if self.training:
            real_scores = scores.detach()[real]
            if not self._started and self.lam_init == "auto":
                with torch.no_grad():
                    first = torch.quantile(real_scores, 1 - self.capacity)
                    (self.lam_last if self.rule.stored else self.lam).copy_(first)
            if self.rule.stored:
                return scores > self._stored_lam(real_scores)
            mark_started(self)
            below = srelu(real_scores - self.lam, self.delta)
            self.auxiliary_loss = below.mean() + self.capacity * self.lam
        return scores > self.lam.detach()

    def _stored_lam(self, real_scores: torch.Tensor) -> torch.Tensor:
        """This batch's λ by the rule, stored as the rule stores a module's (warm start, running average)."""
        one = real_scores.new_ones(1)
        with torch.no_grad():
            used, stored, _ = self.rule.member_lam(
                self, real_scores[None], self.capacity * real_scores.numel() * one, self.delta * one,
                self.lam_last.to(real_scores.dtype, copy=True)[None], not self._started,
            )  # fmt: skip
            self.rule.store(self, stored)
        return used[0]

    def parameter_groups(self) -> list[dict]:
        """λ's optimizer group where the rule trains it (as a loss module's: no weight decay; under
        ``lam_lr`` its own rate, left out of the schedule), else empty."""
        return self.rule.parameter_groups(self)
