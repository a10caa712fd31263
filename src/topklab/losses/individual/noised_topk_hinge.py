"""Garcin et al.'s noised top-K hinge losses (ICML 2022), per sample.

Both replace the (k+1)-th largest score of the top-K calibrated hinge ``[1 + s_[k+1] − s_y]_+`` by
its Gaussian smoothing ``top_{k+1,ε}(s) = E_Z[(s + εZ)_[k+1]]``, estimated with a few draws, with
the gradient ``E[one-hot(argtop-(k+1)(s + εZ))]`` estimated from the same draws.
"""

from __future__ import annotations

import torch
from torch import nn

from topklab.losses.individual.base import class_count_tensor
from topklab.utils.checks import check_int
from topklab.utils.seed import SeededNormal


class _NoisedKthLargest(torch.autograd.Function):
    """Mean over the draws of the k-th largest of ``s + εZ``; backward: the mean one-hot of its index."""

    @staticmethod
    def forward(ctx, scores, noise, k, epsilon):
        noisy = scores.unsqueeze(-1) + epsilon * noise  # (batch, classes, samples)
        values, indices = noisy.topk(k, dim=1)
        ctx.save_for_backward(indices[:, k - 1, :])  # (batch, samples)
        ctx.classes = scores.shape[1]
        return values[:, k - 1, :].mean(-1)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        samples = indices.shape[1]
        hits = grad.new_zeros(len(indices), ctx.classes).scatter_add_(
            1, indices, grad.new_full(indices.shape, 1.0 / samples)
        )
        return hits * grad.unsqueeze(1), None, None, None


def noised_kth_largest(scores: torch.Tensor, k: int, epsilon: float, noise: torch.Tensor) -> torch.Tensor:
    """``top_{k,ε}(s)``: per row, the mean over the draws of the k-th largest of ``s + ε·noise``.

    Parameters
    ----------
    scores : (batch, classes) float tensor
    k : int, 1 <= k <= classes (k = 1: the largest)
    epsilon : float >= 0, the noise scale; 0 gives the exact k-th largest
    noise : (batch, classes, samples) tensor of N(0, 1) draws (the layout of pytopk's ``Z``)

    Returns a (batch,) tensor whose gradient in the scores is the mean one-hot of the k-th largest
    item's index over the draws (Garcin et al.'s estimator): the k-th largest of s + εZ has gradient
    one-hot(its index) almost surely and is 1-Lipschitz, so this is an unbiased estimate of the
    gradient of ``E_Z[(s + εZ)_[k]]``.

    Examples
    --------
    >>> noised_kth_largest(torch.tensor([[3.0, 1.0, 2.0]]), 2, 1.0, torch.zeros(1, 3, 4))
    tensor([2.])
    """
    if noise.shape[:2] != scores.shape or noise.dim() != 3:
        raise ValueError(
            f"noise must have shape (batch, classes, samples) = {tuple(scores.shape)} + (S,), got {tuple(noise.shape)}"
        )
    return _NoisedKthLargest.apply(scores, noise.to(scores.dtype), k, epsilon)


class NoisedTopKHinge(nn.Module):
    """Per-sample balanced noised top-K hinge ``ℓ(s, y) = [1 + top_{k+1,ε}(s) − s_y]_+``. No reduction.

    Zero once the true class's score beats the smoothed (k+1)-th largest by the margin 1, i.e. the
    class is safely in the top k; the batch mean equals pytopk's ``BalNoisedTopK`` with the same draws
    (tested). The draws are new at every call.

    Parameters
    ----------
    k : int, 1 <= k < classes
        The K of top-K accuracy (the loss uses the (k+1)-th largest score).
    epsilon : float > 0
        Noise scale ε in score units. Smaller is closer to the hard top-K hinge (pytopk allows 0);
        larger spreads the gradient over more classes. The authors' README: 1.0.
    num_samples : int >= 1
        Draws of Z per call (pytopk's ``n_sample``, default 5).
    num_classes : int
        Filled in from the dataset.
    seed : int or None
        With an int, the draws come from a ``torch.Generator`` per device seeded with it once when
        the loss first runs there (reproducible); None uses torch's global generator.

    Examples
    --------
    >>> loss = NoisedTopKHinge(k=1, epsilon=1.0, num_samples=5, num_classes=3, seed=0)
    >>> scores, labels = torch.tensor([[5.0, 0.0, -1.0], [0.0, 0.1, 0.2]]), torch.tensor([0, 0])
    >>> loss(scores, labels, noise=torch.zeros(2, 3, 5))   # ε·0: [1 + s_[2] − s_y]_+
    tensor([0.0000, 1.1000])
    >>> loss(scores, labels).shape
    torch.Size([2])

    References
    ----------
    Garcin, Servajean, Joly & Salmon, "Stochastic smoothing of the top-K calibrated hinge loss for
    deep imbalanced classification", ICML 2022: the smoothed top-K value ``top_{K,ε}`` built on
    Berthet et al.'s perturbed optimizers, its gradient estimate, and the balanced noised loss
    ``[1 + top_{K+1,ε}(s) − s_y]_+`` (their "ℓ^{Noised bal}"); the authors' code ``pytopk``
    (garcinc/noised-topk: ``BalNoisedTopK``, ``functional.bal_noised_topk_loss``).
    """

    def __init__(
        self,
        k: int = 5,
        epsilon: float = 1.0,
        num_samples: int = 5,
        num_classes: int | None = None,
        seed: int | None = None,
    ):
        super().__init__()
        name = type(self).__name__
        if num_classes is None:
            raise ValueError(f"{name} needs num_classes; use it with a classification dataset")
        check_int("k", k, 1, num_classes - 1, why=f"fewer than the {num_classes} classes")
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0:
            raise ValueError(f"epsilon={epsilon!r} must be a number > 0 (smaller = closer to the hard top-k hinge)")
        check_int("num_samples", num_samples)
        self.draw = SeededNormal(seed)
        self.k, self.epsilon, self.num_samples, self.seed = k, float(epsilon), num_samples, seed
        self.num_classes = num_classes

    def extra_repr(self) -> str:
        return f"k={self.k}, epsilon={self.epsilon}, num_samples={self.num_samples}, seed={self.seed}"

    def noise(self, output: torch.Tensor) -> torch.Tensor:
        """N(0, 1) draws of shape (batch, classes, num_samples), from the loss's generator if seeded."""
        return self.draw((*output.shape, self.num_samples), output)

    def margin_gap(self, output: torch.Tensor, target: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """``top_{k+1,ε}(s) − s_y`` per sample, after checking the shapes."""
        if output.dim() != 2 or output.shape[1] != self.num_classes:
            raise ValueError(
                f"{type(self).__name__} takes scores of shape (batch, {self.num_classes}), got {tuple(output.shape)}"
            )
        target = target.long()
        noise = self.noise(output) if noise is None else noise
        kth = noised_kth_largest(output, self.k + 1, self.epsilon, noise)
        return kth - output.gather(1, target[:, None])[:, 0]

    def forward(self, output: torch.Tensor, target: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        return torch.relu(1.0 + self.margin_gap(output, target, noise))


class ImbalancedNoisedTopKHinge(NoisedTopKHinge):
    """Per-sample imbalanced noised top-K hinge ``ℓ(s, y) = [scale·(m_y + top_{k+1,ε}(s) − s_y)]_+``.

    Class margins ``m_y ∝ n_y^(−1/4)``, rescaled so that the rarest class gets ``max_m`` (LDAM-style):
    rare classes must win by more. The batch mean equals pytopk's ``ImbalNoisedTopK`` with the same
    draws (tested). No reduction.

    Parameters
    ----------
    k, epsilon, num_samples, num_classes, seed : as :class:`NoisedTopKHinge` (the authors' README
        uses ε = 0.01 here)
    max_m : float > 0
        The largest margin, that of the class with the fewest training examples (README: 0.3).
    scale : float > 0
        Multiplies the hinge; 50 (pytopk's default) assumes normalised last-layer features and
        weights (cosine scores in [−1, 1]); use 1 with unnormalised logits.
    class_counts : list of int > 0
        Training examples per class, filled in from the dataset.

    Examples
    --------
    >>> loss = ImbalancedNoisedTopKHinge(k=1, epsilon=0.01, max_m=0.3, scale=1.0, class_counts=[16, 1, 1])
    >>> loss.margins   # 16^(−1/4) = 1/2 of the rare classes' 0.3
    tensor([0.1500, 0.3000, 0.3000])
    >>> loss(torch.tensor([[0.9, 0.5, 0.0]]), torch.tensor([1]), noise=torch.zeros(1, 3, 5))   # 0.3 + 0.5 − 0.5
    tensor([0.3000])

    References
    ----------
    Garcin, Servajean, Joly & Salmon, ICML 2022: the imbalanced variant of the noised loss with class
    margins (their "ℓ^{Noised imbal}"); the margins m_y ∝ n_y^(−1/4) are LDAM's (Cao et al., NeurIPS
    2019); pytopk's ``ImbalNoisedTopK`` and ``functional.imbal_noised_topk_loss``.
    """

    def __init__(
        self,
        k: int = 5,
        epsilon: float = 0.01,
        num_samples: int = 5,
        num_classes: int | None = None,
        max_m: float = 0.3,
        scale: float = 50.0,
        class_counts: list[int] | None = None,
        seed: int | None = None,
    ):
        counts = class_count_tensor("ImbalancedNoisedTopKHinge", class_counts)
        if num_classes is not None and num_classes != len(counts):
            raise ValueError(f"class_counts has {len(counts)} entries but num_classes={num_classes}; they must agree")
        super().__init__(k=k, epsilon=epsilon, num_samples=num_samples, num_classes=len(counts), seed=seed)
        for name, value in (("max_m", max_m), ("scale", scale)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}={value!r} must be a number > 0")
        margins = counts.pow(-0.25)
        self.max_m, self.scale = float(max_m), float(scale)
        self.register_buffer("margins", (margins * (max_m / margins.max())).float())

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_m={self.max_m}, scale={self.scale}"

    def forward(self, output: torch.Tensor, target: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        gap = self.margin_gap(output, target, noise)
        return torch.relu(self.scale * (self.margins.to(output.dtype)[target.long()] + gap))
