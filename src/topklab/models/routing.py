"""Token routers for Mixture-of-Depths blocks: which tokens of a sequence a block processes.

Every router scores each token with one linear map, ``s_i = w·x_i + b``, and gates a routed token's
block update by ``σ(s_i)`` (so the router gets a gradient from the task); they differ only in the
rule that selects the tokens (Raposo et al. 2024, "Mixture-of-Depths"; the gate choice is ours, see
the README's choices table):

- :class:`TopKRouter`: the ⌈c·L⌉ highest-scoring tokens of each sequence of L tokens (MoD). The
  choice for a token depends on later tokens, so it is not causal: token-by-token decoding cannot
  make it.
- :class:`ProbabilityThresholdRouter`: tokens with ``σ(s_i) > p`` (MoDification's threshold-p).
  Causal; nothing holds the fraction routed near a target.
- :class:`STkThresholdRouter`: tokens with ``s_i > λ``, where λ is one trainable scalar trained by the
  STk objective of the (detached) scores, ``(1/n)Σ SReLU_δ(s_i − λ) + c·λ`` (Xia et al. 2024, Eq. 6
  with k/n = c), whose minimiser is the (1 − c)-quantile of the scores: a fraction c passes, without a
  sort, and causally (λ is a fixed number at inference).

``router(x, real) -> (selected, gate)`` with ``x`` (B, L, d), ``real`` (B, L) bool; after a call,
``router.auxiliary_loss`` holds the term the training objective adds (0 for the first two).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from topklab.losses.smoothing import srelu


def _capacity(value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError(f"router.capacity={value} must lie in (0, 1]")
    return float(value)


class TokenRouter(nn.Module):
    """Shared part: the linear score and the σ gate."""

    def __init__(self, dim: int):
        super().__init__()
        self.score = nn.Linear(dim, 1)  # PyTorch's default init: a zero router would route nothing past a threshold
        self.auxiliary_loss = torch.zeros(())

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        return self.score(x).squeeze(-1).float()

    def select(self, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.scores(x)
        return self.select(scores, real) & real, torch.sigmoid(scores)


class TopKRouter(TokenRouter):
    """The ⌈capacity · L_b⌉ highest scores of each sequence b (L_b its real tokens); ties go to the
    earlier position.

    Parameters
    ----------
    dim : int, model width (given by the model)
    capacity : float in (0, 1], the fraction of each sequence's tokens the block processes

    Examples
    --------
    >>> router = TopKRouter(dim=4, capacity=0.5)
    >>> selected, gate = router(torch.randn(2, 6, 4), torch.ones(2, 6, dtype=torch.bool))
    >>> selected.sum(1).tolist()
    [3, 3]
    """

    causal = False

    def __init__(self, dim: int, capacity: float = 0.125):
        super().__init__(dim)
        self.capacity = _capacity(capacity)

    def select(self, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        counts = torch.ceil(self.capacity * real.sum(1)).long()
        ranked = scores.masked_fill(~real, -math.inf).argsort(dim=1, descending=True, stable=True)
        rank = torch.empty_like(ranked).scatter_(1, ranked, torch.arange(scores.shape[1], device=scores.device).expand_as(ranked))
        return rank < counts[:, None]


class ProbabilityThresholdRouter(TokenRouter):
    """Tokens whose gate ``σ(s_i)`` exceeds a fixed probability p (MoDification's threshold-p).

    Parameters
    ----------
    dim : int, model width (given by the model)
    probability : float in (0, 1), the gate a token needs to be processed (higher = fewer tokens)

    Examples
    --------
    >>> router = ProbabilityThresholdRouter(dim=4, probability=0.5)
    >>> _ = router.score.bias.data.fill_(1.0)
    >>> router(torch.zeros(1, 3, 4), torch.ones(1, 3, dtype=torch.bool))[0].tolist()
    [[True, True, True]]
    """

    causal = True

    def __init__(self, dim: int, probability: float = 0.5):
        super().__init__(dim)
        if not 0 < probability < 1:
            raise ValueError(f"router.probability={probability} must lie in (0, 1)")
        self.probability = float(probability)

    def select(self, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(scores) > self.probability


class STkThresholdRouter(TokenRouter):
    """Tokens scoring above a learned threshold λ trained so that a fraction ``capacity`` passes.

    The auxiliary term (added to the training objective; λ is its only trainable input, the scores
    are detached) is the STk loss of the scores with k/n = c (Eq. 6 of Xia et al. 2024)::

        A(λ) = (1/n) Σ_i SReLU_δ(s_i − λ) + c·λ,     ∂A/∂λ = c − (1/n) Σ_i SReLU'_δ(s_i − λ)

    over the n real tokens of the batch: λ moves until a smoothed fraction c of them lies above it.

    With Adam, λ moves about its learning rate per step whatever the gradient, while the scores it
    must follow move with the router's weights; at the model's learning rate λ lags far behind
    (``routing/stk_threshold_c0125_lam0_model_lr``). Hence λ starts at the (1 − c)-quantile of the
    first training batch's scores (one sort, once; ``lam_init="auto"``) and has its own learning rate.

    Parameters
    ----------
    dim : int, model width (given by the model)
    capacity : float in (0, 1], the target fraction of tokens processed
    delta : float > 0, SReLU width δ in score units (smaller = a sharper count; the paper's 0.01)
    lam_init : float or "auto", λ's first value; ``auto``: the (1 − c)-quantile of the scores of the first
        training batch (per process). Not given by the paper.
    lam_lr : float > 0 or None, λ's learning rate in its own parameter group (without weight decay, under
        the run's schedule); None: the optimizer's. Not given by the paper.

    Examples
    --------
    >>> router = STkThresholdRouter(dim=4, capacity=0.25, lam_init=0.0)
    >>> _ = router.score.weight.data.zero_(), router.score.bias.data.zero_()
    >>> selected, gate = router(torch.randn(2, 8, 4), torch.ones(2, 8, dtype=torch.bool))
    >>> router.auxiliary_loss.backward(); router.lam.grad.item()   # all scores 0 = λ: half pass smoothly
    -0.25
    """

    causal = True

    def __init__(self, dim: int, capacity: float = 0.125, delta: float = 0.01, lam_init: float | str = "auto",
                 lam_lr: float | None = None):
        super().__init__(dim)
        self.capacity = _capacity(capacity)
        if not delta > 0:
            raise ValueError(f"router.delta={delta} must be > 0")
        if lam_init != "auto" and not (isinstance(lam_init, (int, float)) and math.isfinite(lam_init)):
            raise ValueError(f"router.lam_init={lam_init!r} must be a finite number or 'auto'")
        if lam_lr is not None and not lam_lr > 0:
            raise ValueError(f"router.lam_lr={lam_lr} must be > 0, or null for the optimizer's learning rate")
        self.delta, self.lam_lr = float(delta), lam_lr
        self.lam = nn.Parameter(torch.tensor(0.0 if lam_init == "auto" else float(lam_init)))
        self.register_buffer("lam_started", torch.tensor(lam_init != "auto"))  # in the checkpoint: a resume keeps λ

    def select(self, scores: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        if self.training:
            real_scores = scores.detach()[real]
            if not self.lam_started:
                with torch.no_grad():
                    self.lam.copy_(torch.quantile(real_scores, 1 - self.capacity))
                self.lam_started.fill_(True)
            below = srelu(real_scores - self.lam, self.delta)
            self.auxiliary_loss = below.mean() + self.capacity * self.lam
        return scores > self.lam.detach()
