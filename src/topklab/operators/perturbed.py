"""PerturbedTopK: the perturbed-optimizer top-k (Berthet et al., NeurIPS 2020), the differentiable
top-k of Cordonnier et al.'s patch selection (CVPR 2021).

The hard top-k indicator is ``y(x) = argmax_{y ∈ C} ⟨y, x⟩`` over C = {0/1 vectors with k ones}
(for the permutation, the one-hot rank matrix of the k largest, which maximises ``⟨P, x rᵀ⟩`` over
partial permutation matrices for any decreasing r). Its perturbed version ``y_σ(x) = E_Z[y(x + σZ)]``,
Z ~ N(0, I), is smooth in x with the Jacobian ``J y_σ(x) = E[y(x + σZ) Zᵀ]/σ`` (Berthet et al.,
Prop. 3.1, with the Gaussian's ∇ν(z) = z; for a Gaussian this is Stein's lemma and holds for any
bounded y). Both expectations are estimated with the same ``num_samples`` draws.
"""

from __future__ import annotations

import torch

from topklab.operators.base import TopKOperator, positive
from topklab.utils.checks import check_int
from topklab.utils.seed import SeededNormal


class _PerturbedTopK(torch.autograd.Function):
    """Monte-Carlo ``E[y(x + σZ)]`` and the vector-Jacobian product ``E[⟨g, y(x + σZ)⟩·Z]/σ``.

    ``noise`` is (S, batch, n). The top-k indices of each perturbed row are kept, not the one-hot
    samples: the forward counts them (exact integer counts, so the result does not depend on the
    order of summation) and ``⟨g, y⟩`` is a gather of g at them."""

    @staticmethod
    def forward(ctx, scores, noise, k, sigma, as_permutation):
        samples, batch, n = noise.shape
        indices = (scores.unsqueeze(0) + sigma * noise).topk(k, dim=2).indices  # (S, batch, k), by rank
        cell = indices + n * torch.arange(batch, device=scores.device).view(1, batch, 1)  # row-major (b, i)
        if as_permutation:
            cell = cell * k + torch.arange(k, device=scores.device)  # row-major (b, i, j)
        counts = torch.bincount(cell.reshape(-1), minlength=batch * n * (k if as_permutation else 1))
        out = (
            (counts.to(scores.dtype) / samples).view(batch, n, k)
            if as_permutation
            else (counts.to(scores.dtype) / samples).view(batch, n)
        )
        ctx.save_for_backward(noise, indices)
        ctx.sigma, ctx.as_permutation = sigma, as_permutation
        return out

    @staticmethod
    def backward(ctx, grad):
        noise, indices = ctx.saved_tensors
        samples, batch, k = indices.shape
        if ctx.as_permutation:  # ⟨g, y⟩ = Σ_j g[b, index_j, j]
            picked = grad.unsqueeze(0).expand(samples, -1, -1, -1).gather(2, indices.unsqueeze(2)).squeeze(2)
        else:  # ⟨g, y⟩ = Σ_j g[b, index_j]
            picked = grad.unsqueeze(0).expand(samples, -1, -1).gather(2, indices)
        inner = picked.sum(2)  # (S, batch)
        return torch.einsum("sb,sbn->bn", inner, noise) / (samples * ctx.sigma), None, None, None, None


class PerturbedTopK(TopKOperator):
    """Soft top-k (and top-k permutation) as the expectation of the hard one under Gaussian noise.

    ``soft_topk(x, k) ≈ E[hard_topk(x + σZ, k)]`` and ``permutation(x, k) ≈ E[hard_permutation(x + σZ,
    k)]``, each the mean of ``num_samples`` draws, so every entry is a multiple of 1/num_samples and
    every draw has exactly k ones (Σp = k). The backward is Berthet et al.'s estimator of the
    Jacobian of the expectation, ``E[y(x + σZ) Zᵀ]/σ``, from the same draws: unbiased for the
    smoothed operator, with a variance that grows like 1/(σ²·num_samples).

    Parameters
    ----------
    sigma : float > 0
        Noise scale σ, in score units. Smaller is closer to the hard top-k (σ → 0 gives it exactly on
        distinct scores) with a noisier gradient; larger smooths more. Cordonnier et al. use 0.05.
    num_samples : int >= 1
        Monte-Carlo draws per call (Cordonnier et al.: 500; the forward's standard error is at most
        ½/√num_samples per entry).
    seed : int or None
        With an int, the draws come from a ``torch.Generator`` per device seeded with it once when
        the module first runs there: two modules with the same seed give the same sequence of
        outputs. None draws from torch's global generator (``torch.manual_seed`` governs it).

    Notes
    -----
    Extreme inputs (the rule of :mod:`topklab.operators.base`, the operator's own limit: noise does
    not move an infinite score): +inf entries are in every draw's top k and −inf entries in none, so
    the finite entries get the perturbed top-(k − m₊) of the finite entries (the same draws as for a
    finite row: seeded outputs do not change); the infinite entries' shares follow the rule (several
    +inf share their ranks evenly, rather than by index as ``torch.topk`` breaks their ties), and
    their gradient is 0. A NaN score makes its row NaN (``torch.topk`` would rank it first); an
    empty batch gives an empty result; any finite score works (``x + σZ`` saturates at ±inf at worst).

    The permutation is ordered by rank (column j = the (j+1)-th largest), as everywhere in
    :mod:`topklab.operators`; Cordonnier et al. instead order the k selected patches by position.
    Their released code had two bugs in this backward (a transposed Jacobian, and a dot product
    where ``E[y Zᵀ]`` needs an outer product; see the google-research ptopk_patch_selection README);
    the estimator here is the outer-product one of Berthet et al.

    Examples
    --------
    >>> op = PerturbedTopK(sigma=0.5, num_samples=10000, seed=0)
    >>> p = op.soft_topk(torch.tensor([[2.0, 1.0, 0.8, -3.0]], dtype=torch.float64), k=2)
    >>> p, round(p.sum().item(), 9)
    (tensor([[0.9870, 0.6163, 0.3967, 0.0000]], dtype=torch.float64), 2.0)
    >>> PerturbedTopK(sigma=1e-6, num_samples=4, seed=0).permutation(torch.tensor([[2.0, 0.0, 1.9]]), k=2)
    tensor([[[1., 0.],
             [0., 0.],
             [0., 1.]]])
    >>> tied = torch.tensor([[float("inf"), 0.0, float("inf")]])
    >>> PerturbedTopK(sigma=1e-6, num_samples=4, seed=0).soft_topk(tied, k=1)   # two +inf share k = 1
    tensor([[0.5000, 0.0000, 0.5000]])

    References
    ----------
    Berthet, Blondel, Teboul, Cuturi, Vert & Bach, "Learning with Differentiable Perturbed Optimizers",
    NeurIPS 2020: the perturbed maximiser y*_ε(θ) = E[y*(θ + εZ)] and its Jacobian E[y*(θ + εZ)∇ν(Z)ᵀ]/ε
    (Prop. 3.1). Cordonnier, Mahendran, Dosovitskiy, Weissenborn, Uszkoreit & Unterthiner,
    "Differentiable Patch Selection for Image Recognition", CVPR 2021 (the perturbed top-k, σ = 0.05).
    """

    gives_permutation = True
    sums_to_k = True
    stochastic = True

    def __init__(self, sigma: float = 0.05, num_samples: int = 500, seed: int | None = None):
        super().__init__()
        self.sigma = positive(sigma, "sigma", "smaller = closer to the hard top-k, noisier gradient")
        check_int("num_samples", num_samples)
        self.draw = SeededNormal(seed)
        self.num_samples = num_samples
        self.seed = seed

    def extra_repr(self) -> str:
        return f"sigma={self.sigma}, num_samples={self.num_samples}, seed={self.seed}"

    def noise(self, scores: torch.Tensor) -> torch.Tensor:
        """Standard normal draws of shape (num_samples, batch, n), from the module's generator if seeded."""
        return self.draw((self.num_samples, *scores.shape), scores)

    def _soft_topk(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        return _PerturbedTopK.apply(scores, self.noise(scores), k, self.sigma, False)

    def _permutation(self, scores: torch.Tensor, k: int, rest) -> torch.Tensor:
        return _PerturbedTopK.apply(scores, self.noise(scores), k, self.sigma, True)
