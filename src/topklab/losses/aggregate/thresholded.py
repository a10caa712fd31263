from __future__ import annotations

import torch
from torch import nn

from topklab.losses.aggregate.base import Aggregate
from topklab.losses.aggregate.kernels import KERNELS, thresholded
from topklab.losses.k import validate_k
from topklab.losses.smoothing import get_smoothing
from topklab.losses.threshold import get_constraint

SCALES = ("paper", "atk")


class ThresholdedTopK(Aggregate):
    """``(1/n)·Σ φ(ℓ_i − λ) + (k/n)·λ`` with a trainable threshold λ; the common form of MATk
    (φ = ReLU) and STk (φ smooth). Use :class:`MATk` or :class:`STk`.

    ``scale="paper"`` returns the equation as printed (factor k/n relative to ATk at the optimum);
    ``scale="atk"`` multiplies by n/k so that the minimum over λ equals ATk (Fan et al.'s MATk form).

    Value and gradients come from the fused kernels of :mod:`topklab.losses.aggregate.kernels`:
    ``kernel="auto"`` runs the C++ one (CPU) or the ``torch.compile``-d one (GPU) on rows of at
    least ``compile_min_n`` losses and the eager one below that; ``"native"``, ``"compiled"`` and
    ``"eager"`` force one (see :meth:`path_for`).
    """

    hyperparameters = ("k",)
    has_threshold = True

    def __init__(
        self,
        k: int | float,
        smoothing: str,
        delta: float | None = 0.01,
        lam_init: float = 0.0,
        lam_constraint: str = "none",
        scale: str = "paper",
        kernel: str = "auto",
        compile_min_n: int = 16384,
    ):
        super().__init__()
        self.k = validate_k(k)
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; choose one of: {', '.join(KERNELS)}")
        if isinstance(compile_min_n, bool) or not isinstance(compile_min_n, int) or compile_min_n < 1:
            raise ValueError(f"compile_min_n={compile_min_n!r} must be an integer >= 1 (rows at least this long "
                             f"use the compiled kernel under kernel=auto)")
        if delta is not None and not (isinstance(delta, (int, float)) and not isinstance(delta, bool) and delta > 0):
            raise ValueError(f"delta={delta!r} must be a positive number (the paper uses 0.01)")
        if scale not in SCALES:
            raise ValueError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
        if smoothing == "srelu" and delta is None:
            raise ValueError("smoothing='srelu' needs its width delta > 0 (the paper uses 0.01)")
        self.smoothing = smoothing
        self._phi = get_smoothing(smoothing)
        self.delta = None if delta is None else float(delta)
        self.scale = scale
        self.kernel = kernel
        self.compile_min_n = compile_min_n
        self._constraint = get_constraint(lam_constraint)
        self.lam = nn.Parameter(torch.tensor(float(self.lam_of(lam_init))))

    @property
    def lam_constraint(self) -> str:
        return self._constraint.name

    @property
    def threshold(self) -> torch.Tensor:
        """The effective λ (after the constraint), which approaches the k-th largest loss."""
        return self.threshold_of(self.lam)

    def threshold_of(self, lam: torch.Tensor) -> torch.Tensor:
        """The effective λ of stored values ``lam`` (any shape; e.g. one per population member)."""
        return self._constraint.value(lam)

    def lam_of(self, threshold: float) -> float:
        """The stored value whose effective λ is ``threshold`` (the inverse of :meth:`threshold_of`)."""
        return self._constraint.raw_from_value(float(threshold))

    def batched(self, losses, k, lam, delta):
        """Per row p: ``(1/n)·Σ_i φ_δp(ℓ_pi − λ_p) + (k_p/n)·λ_p`` (times n/k_p under ``scale="atk"``),
        through the fused kernel (:func:`~topklab.losses.aggregate.kernels.thresholded`)."""
        n = losses.shape[1]
        scale = n / k if self.scale == "atk" else torch.ones_like(k)
        if delta is None:
            if self._phi.uses_delta:
                raise ValueError(f"smoothing={self.smoothing!r} needs a width delta > 0 for every row; got None")
            delta = torch.zeros_like(k)
        return thresholded(losses, lam, delta, k, scale, self._phi, self.path_for(losses), required=self.kernel != "auto")

    def path_for(self, losses: torch.Tensor) -> str:
        """The kernel path for a (P, n) block: ``kernel`` unless it is ``auto``, which takes the fast
        kernel ("native": the C++ one on a CPU, which :func:`thresholded` turns into the compiled one
        on a GPU) for rows of at least ``compile_min_n`` losses and the eager kernel for shorter rows.
        Inside a user's ``torch.compile`` always eager."""
        if torch.compiler.is_compiling():
            return "eager"
        if self.kernel != "auto":
            return self.kernel
        return "eager" if losses.shape[1] < self.compile_min_n else "native"

    def extra_repr(self) -> str:
        return (
            f"k={self.k}, smoothing={self.smoothing!r}, delta={self.delta}, "
            f"lam_constraint={self.lam_constraint!r}, scale={self.scale!r}{self._kernel_repr()}"
        )

    def _kernel_repr(self) -> str:
        return f", kernel={self.kernel!r}" + (f", compile_min_n={self.compile_min_n}" if self.kernel == "auto" else "")


class MATk(ThresholdedTopK):
    """Minimised average-top-k loss, STk paper Eq. 5 (Ogryczak & Tamir 2003):

    ``L_mat-k(λ) = (1/n)·Σ [ℓ_i − λ]_+ + (k/n)·λ``

    trained jointly over the model and λ (put ``loss.parameters()`` in the optimizer).
    ``min_λ L_mat-k = (k/n)·ATk``: the default scale is the paper's k/n, **not** ATk's 1/k.

    Parameters
    ----------
    k : int >= 1 or float in (0, 1]
        A count, or a fraction of the batch (rounded half-up, at least 1).
    lam_init : float
        Initial λ (not given by the paper). Default 0.
    lam_constraint : {"none", "clamp", "softplus"}
        How λ >= 0 is kept (not given by the paper); see :mod:`topklab.losses.threshold`.
    scale : {"paper", "atk"}
        ``paper`` = Eq. 5 as printed; ``atk`` multiplies by n/k.
    kernel : {"auto", "native", "compiled", "eager"}
        ``auto`` = on rows of >= ``compile_min_n`` losses the C++ kernel on a CPU and the
        ``torch.compile``-d one on a GPU, falling back where they cannot be built; below that
        the eager kernel, whose gradients are autograd's of the formula bit for bit. All agree to
        float32 rounding.
    compile_min_n : int >= 1
        The shortest row that ``auto`` sends to the native or compiled kernel. Default 16384.

    Examples
    --------
    >>> loss = MATk(k=2, lam_init=3.0)
    >>> loss(torch.tensor([1.0, 5.0, 3.0, 0.0]))  # λ = ℓ_[2] = 3 is optimal: (2/4)·ATk = 2
    tensor(2., grad_fn=<SqueezeBackward1>)
    >>> losses = torch.tensor([[1.0, 5.0, 3.0, 0.0], [1.0, 5.0, 3.0, 0.0]])
    >>> loss.batched(losses, k=torch.tensor([2.0, 1.0]), lam=torch.tensor([3.0, 5.0]), delta=None)  # row by row
    tensor([2.0000, 1.2500])
    """

    def __init__(self, k: int | float, lam_init: float = 0.0, lam_constraint: str = "none", scale: str = "paper",
                 kernel: str = "auto", compile_min_n: int = 16384):
        super().__init__(k, smoothing="relu", delta=None, lam_init=lam_init, lam_constraint=lam_constraint, scale=scale,
                         kernel=kernel, compile_min_n=compile_min_n)

    def extra_repr(self) -> str:
        return f"k={self.k}, lam_constraint={self.lam_constraint!r}, scale={self.scale!r}{self._kernel_repr()}"


class STk(ThresholdedTopK):
    """Smoothed top-k loss, STk paper Eq. 6 (Xia, Liu & Mao, NeurIPS 2024):

    ``L_st-k(λ) = (1/n)·Σ SReLU_δ(ℓ_i − λ) + (k/n)·λ``,  SReLU (Eq. 2) = ½(x + √(x²+δ²) − δ)

    Sort-free and O(n). λ is the module parameter ``lam``; train it with the model (SGD-STk).
    ``L_mat-k − δ/2 <= L_st-k <= L_mat-k`` for every λ, and L_st-k → L_mat-k as δ → 0.
    The default scale is the paper's k/n, **not** ATk's 1/k.

    Parameters
    ----------
    k : int >= 1 or float in (0, 1]
        A count, or a fraction of the batch (rounded half-up, at least 1).
    delta : float, > 0
        SReLU smoothing width; smaller is closer to MATk. Paper default 0.01. Ignored by the
        other smoothings.
    smoothing : {"srelu", "elu", "softplus", "leaky_relu"}
        φ in place of ReLU; the others are the Table 2 ablation at PyTorch defaults.
    lam_init, lam_constraint, scale, kernel, compile_min_n
        As in :class:`MATk`.

    Examples
    --------
    >>> loss = STk(k=0.5, delta=0.01, lam_init=3.0)
    >>> round(loss(torch.tensor([1.0, 5.0, 3.0, 0.0])).item(), 4)  # MATk gives 2; STk is within δ/2 below
    1.9963
    >>> per_member = loss.batched(torch.tensor([[1.0, 5.0, 3.0, 0.0]] * 2), torch.tensor([2.0, 2.0]),
    ...                           torch.tensor([3.0, 3.0]), delta=torch.tensor([0.01, 1.0]))
    >>> [round(v, 4) for v in per_member.tolist()]  # a wider δ lies further below MATk
    [1.9963, 1.7043]
    """

    hyperparameters = ("k", "delta")

    def __init__(
        self,
        k: int | float,
        delta: float = 0.01,
        smoothing: str = "srelu",
        lam_init: float = 0.0,
        lam_constraint: str = "none",
        scale: str = "paper",
        kernel: str = "auto",
        compile_min_n: int = 16384,
    ):
        super().__init__(k, smoothing=smoothing, delta=delta, lam_init=lam_init, lam_constraint=lam_constraint, scale=scale,
                         kernel=kernel, compile_min_n=compile_min_n)
