"""Which gradient entries a worker sends: the indices of (about) the k largest magnitudes.

Three rules, each an ``nn.Module`` whose buffers (a warm start, a random stream) are checkpointed
with the run, called as ``selector(magnitudes, k) -> indices``:

- :class:`ExactTopK`: ``torch.topk`` (exactly k).
- :class:`SampledThreshold`: Deep Gradient Compression's rule (Lin et al., ICLR 2018): the threshold
  is the k-th largest of a random sample, adapted until the count is near k, then trimmed to k by an
  exact top-k among the candidates.
- :class:`STkThresholdSelector`: the STk threshold λ (Xia et al., NeurIPS 2024, Eq. 3) solved on the
  magnitudes by safeguarded Newton, warm-started from the previous step; sends ``|g| > λ``, which is
  k up to the smoothing (sort-free: O(n) passes only).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from topklab.losses.aggregate.kernels import native_extension, native_ready
from topklab.utils.checks import check_int

KERNELS = ("eager", "native")


def _check(magnitudes: torch.Tensor, k: int) -> None:
    if magnitudes.dim() != 1:
        raise ValueError(f"magnitudes must be 1-D, got shape {tuple(magnitudes.shape)}")
    check_int("k", k, 1, magnitudes.numel())


class ExactTopK(nn.Module):
    """The indices of the k largest magnitudes (``torch.topk``, unsorted).

    Examples
    --------
    >>> sorted(ExactTopK()(torch.tensor([0.1, 3.0, 0.2, 2.0]), 2).tolist())
    [1, 3]
    """

    def forward(self, magnitudes: torch.Tensor, k: int) -> torch.Tensor:
        _check(magnitudes, k)
        return magnitudes.topk(k, sorted=False).indices


class SampledThreshold(nn.Module):
    """DGC's sampled threshold (Lin et al. 2018), with an adaptation that cannot send fewer than k.

    Draw ``max(1, ⌊sample_ratio·n⌋)`` magnitudes uniformly with replacement, take the threshold τ as
    the ``⌈(k/n)·samples⌉``-th largest of them, and count the candidates ``|g| >= τ``; then adapt τ
    (at most ``max_adaptation_iters`` times) and trim the candidates to the k largest by an exact
    top-k among them. Two adaptations:

    - ``"bracketed"`` (default): accept a count in [k, ``upper``·k]; otherwise move τ to the
      geometric midpoint of the tightest thresholds known to give too many and too few candidates
      (×``upper`` or ×``lower`` while one side is unknown). The candidates sent come from the
      tightest threshold seen with at least k of them (τ = 0, every entry, if none), so a message is
      always exactly k entries.
    - ``"dgc"``: the reference code's ``resample=False`` rule, τ ×``upper`` while the count exceeds
      ``upper``·k and ×``lower`` while it is under ``lower``·k. Near a small quantile one factor
      changes the count several-fold, so the loop can oscillate and stop below k (it then sends
      fewer than k).

    Parameters
    ----------
    sample_ratio : float in (0, 1], the fraction of entries sampled (DGC: 0.01)
    upper, lower : floats > 1 and in (0, 1), the adaptation factors and DGC's band (DGC: 1.3, 0.8)
    max_adaptation_iters : int >= 0 (DGC: 10)
    adaptation : {"bracketed", "dgc"}, see above
    seed : int or None, seeds this selector's own random stream (checkpointed); None draws the seed
        from torch's global generator (seeded by the run), so each worker's selector gets its own

    Examples
    --------
    >>> values = torch.arange(1000, dtype=torch.float32)
    >>> indices = SampledThreshold(sample_ratio=0.5, seed=0)(values, 10)
    >>> len(indices), int(values[indices].min())
    (10, 990)
    """

    def __init__(
        self,
        sample_ratio: float = 0.01,
        upper: float = 1.3,
        lower: float = 0.8,
        max_adaptation_iters: int = 10,
        adaptation: str = "bracketed",
        seed: int | None = None,
    ):
        super().__init__()
        if not 0 < sample_ratio <= 1:
            raise ValueError(f"sample_ratio={sample_ratio} must lie in (0, 1]")
        if not upper > 1 or not 0 < lower < 1:
            raise ValueError(f"upper={upper} must be > 1 and lower={lower} in (0, 1)")
        check_int("max_adaptation_iters", max_adaptation_iters, 0)
        if adaptation not in ("bracketed", "dgc"):
            raise ValueError(f"adaptation={adaptation!r}; choose bracketed or dgc")
        self.sample_ratio, self.upper, self.lower, self.max_adaptation_iters = (
            sample_ratio,
            upper,
            lower,
            max_adaptation_iters,
        )
        self.adaptation = adaptation
        if seed is None:
            seed = int(torch.randint(2**62, ()))
        self.register_buffer("generator_state", torch.Generator().manual_seed(seed).get_state())

    def forward(self, magnitudes: torch.Tensor, k: int) -> torch.Tensor:
        _check(magnitudes, k)
        n = magnitudes.numel()
        generator = torch.Generator().set_state(self.generator_state.cpu())
        samples = max(1, int(self.sample_ratio * n))
        drawn = magnitudes[torch.randint(0, n, (samples,), generator=generator).to(magnitudes.device)]
        self.generator_state = generator.get_state()
        threshold = float(drawn.topk(min(samples, math.ceil(k / n * samples)), sorted=False).values.min())
        candidates = (magnitudes >= threshold).nonzero().view(-1)
        adapt = self._bracketed if self.adaptation == "bracketed" else self._dgc
        candidates = adapt(magnitudes, k, threshold, candidates)
        if len(candidates) > k:
            candidates = candidates[magnitudes[candidates].topk(k, sorted=False).indices]
        return candidates

    def _dgc(self, magnitudes, k, threshold, candidates):
        for _ in range(self.max_adaptation_iters):
            if len(candidates) > self.upper * k:
                threshold = threshold * self.upper
            elif len(candidates) < self.lower * k and threshold > 0:
                threshold = threshold * self.lower
            else:
                break
            candidates = (magnitudes >= threshold).nonzero().view(-1)
        return candidates

    def _bracketed(self, magnitudes, k, threshold, candidates):
        enough, too_high = None, None  # (threshold, candidates) with >= k candidates; a threshold with < k
        for _ in range(self.max_adaptation_iters + 1):
            if len(candidates) >= k:
                if enough is None or threshold > enough[0]:
                    enough = (threshold, candidates)
                if len(candidates) <= self.upper * k:
                    break
            else:
                too_high = threshold if too_high is None else min(too_high, threshold)
            if threshold <= 0:
                break
            low = enough[0] if enough is not None else None
            if low is not None and too_high is not None:
                threshold = math.sqrt(max(low, 1e-300) * too_high)
            else:
                threshold = threshold * (self.upper if too_high is None else self.lower)
            candidates = (magnitudes >= threshold).nonzero().view(-1)
        if enough is None:
            return torch.arange(magnitudes.numel(), device=magnitudes.device)
        return enough[1]


class STkThresholdSelector(nn.Module):
    """``|g| > λ`` with λ the STk threshold of the magnitudes: the root of
    ``G(λ) = Σ_i SReLU'_δ(|g_i| − λ) − k`` (the stationarity condition of Eq. 3), with the width
    ``δ = delta · mean|g|`` so that it follows the gradient's scale.

    Safeguarded Newton (``G' = −Σ ½δ²/r_i³``, r_i = √((|g_i| − λ)² + δ²)) inside the bracket
    [0, max|g|], bisecting whenever Newton's point leaves it, starting from the previous call's λ
    (a warm start: between steps the magnitudes change little). It stops once
    ``|G| <= count_tolerance · k``; the count sent is then k up to that tolerance and the smoothing.
    Where more than 2k magnitudes tie at the largest (clipped gradients), none exceeds the root there:
    k of the tie are sent, the lowest indices first.

    Parameters
    ----------
    delta : float > 0, SReLU width relative to the mean magnitude (smaller = the smoothed count is
        closer to the hard count, and Newton's G' is rougher)
    count_tolerance : float in (0, 1), stop when the smoothed count is within this fraction of k
    max_iter : int >= 1, the most Newton/bisection steps per call (then λ is used as it stands)
    warm_start : bool, start from the last λ (else from the bracket's midpoint)
    kernel : {"eager", "native"}, how a Newton step's two sums over the magnitudes are taken: torch
        operations (about six passes with temporaries) or one C++ pass in the thresholded losses'
        extension (:mod:`topklab.losses.aggregate.kernels`; CPU float32/float64, else eager; one
        warning and eager where it cannot be built). The same sums to float64 rounding, so λ can differ
        in its last bits; the committed sparsification rows ran ``eager``.

    Examples
    --------
    >>> values = torch.rand(10_000, generator=torch.Generator().manual_seed(0))
    >>> selector = STkThresholdSelector()
    >>> abs(len(selector(values, 100)) - 100) <= 10
    True
    """

    def __init__(
        self,
        delta: float = 0.01,
        count_tolerance: float = 0.05,
        max_iter: int = 50,
        warm_start: bool = True,
        kernel: str = "eager",
    ):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; choose one of: {', '.join(KERNELS)}")
        if not delta > 0:
            raise ValueError(f"delta={delta} must be > 0")
        if not 0 < count_tolerance < 1:
            raise ValueError(f"count_tolerance={count_tolerance} must lie in (0, 1)")
        check_int("max_iter", max_iter)
        self.delta, self.count_tolerance, self.max_iter, self.warm_start = delta, count_tolerance, max_iter, warm_start
        self.kernel = kernel
        self.register_buffer("lam", torch.tensor(float("nan"), dtype=torch.float64))
        self.iterations = 0

    def threshold(self, magnitudes: torch.Tensor, k: int) -> float:
        """λ with ``Σ SReLU'(|g| − λ) ≈ k`` (and the number of steps it took in ``self.iterations``)."""
        _check(magnitudes, k)
        delta = self.delta * float(magnitudes.mean())
        if delta == 0:
            return 0.0
        low, high = 0.0, float(magnitudes.max())
        lam = float(self.lam)
        if not (self.warm_start and low < lam < high):
            lam = 0.5 * (low + high)
        n = magnitudes.numel()
        native = self.kernel == "native" and native_ready(magnitudes, "using torch operations instead")
        sums = self._native_sums if native else _ratio_sums
        for iteration in range(1, self.max_iter + 1):
            self.iterations = iteration
            # Σ SReLU'(z) = ½(n + Σ z/r): the tail's δ²/(2z²) is below float32's resolution but adds < 1 to the count
            ratio, cubes = sums(magnitudes, lam, delta)
            excess = 0.5 * (n + ratio) - k
            if abs(excess) <= self.count_tolerance * k:
                break
            if excess > 0:
                low = lam
            else:
                high = lam
            slope = 0.5 * delta * delta * cubes
            newton = lam + excess / slope if slope > 0 else math.nan
            lam = newton if low < newton < high else 0.5 * (low + high)
        self.lam.fill_(lam)
        return lam

    @staticmethod
    def _native_sums(magnitudes: torch.Tensor, lam: float, delta: float) -> tuple[float, float]:
        return tuple(native_extension().srelu_ratio_sums(magnitudes, lam, delta))

    def forward(self, magnitudes: torch.Tensor, k: int) -> torch.Tensor:
        chosen = (magnitudes > self.threshold(magnitudes, k)).nonzero().view(-1)
        if chosen.numel() > 0:
            return chosen
        # none above λ: more than 2k magnitudes tie at the largest (clipped gradients) and the smoothed
        # count's root lies there to the magnitudes' precision; send k of the tie, the lowest indices
        # first (torch.topk's rule for ties), rather than nothing (all zero: nothing to send)
        largest = magnitudes.max()
        return (magnitudes == largest).nonzero().view(-1)[:k] if largest > 0 else chosen


def _ratio_sums(magnitudes: torch.Tensor, lam: float, delta: float) -> tuple[float, float]:
    """``(Σ z/r, Σ r⁻³)`` with ``z = |g| − λ``, ``r = √(z² + δ²)``, by torch operations summed in float64."""
    z = magnitudes - lam
    root = torch.sqrt(z * z + delta * delta)
    return float((z / root).sum(dtype=torch.float64)), float(root.pow_(-3).sum(dtype=torch.float64))
