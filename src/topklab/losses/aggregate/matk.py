"""MATk (STk paper Eq. 5): the average-top-k loss as a minimisation over a threshold λ."""

from __future__ import annotations

import torch

from topklab.losses.aggregate.lambda_rules import LambdaRule
from topklab.losses.aggregate.thresholded import ThresholdedTopK


class MATk(ThresholdedTopK):
    """Minimised average-top-k loss, STk paper Eq. 5 (Ogryczak & Tamir 2003):

    ``L_mat-k(λ) = (1/n)·Σ [ℓ_i − λ]_+ + (k/n)·λ``

    minimised over the model and λ. ``min_λ L_mat-k = (k/n)·ATk``: the default scale is the
    paper's k/n, **not** ATk's 1/k. Where λ is the batch's k-th largest loss ℓ_[k] (the rule
    ``"solve"``, a stored rule's first call, ``lam_init="auto"`` on one row), MATk is exactly (k/n)·ATk,
    its gradient included: the losses tied at ℓ_[k] share the mass ReLU's zero slope there leaves out.

    Parameters
    ----------
    k : int >= 1, float in (0, 1] or Tensor
        A count, or a fraction of the batch (rounded half-up, at least 1). A tensor gives each row
        its own k: integer counts in [1, n] or floating fractions in (0, 1], of a shape that
        broadcasts to the losses' shape without ``dim``.
    lam_update : {"adaptive", "track", "solve", "gradient"} or LambdaRule
        How λ follows the losses (:mod:`~topklab.losses.aggregate.lambda_rules`). None (default):
        "adaptive", the exact k-th largest loss on batches below 256 losses and a step per call within
        a window around λ from there on; "solve", the exact k-th largest loss of every training
        batch; "track", a step per call; "gradient", a parameter trained by the optimizer (the
        paper's SGD-STk: put ``loss.parameters()`` in the optimizer).
    lam_lr : float > 0 or None
        "gradient" only: λ's own learning rate in the engine (its own parameter group, no schedule);
        None = the model's rate and schedule (the paper's setting).
    lam_init : float or "auto"
        Initial λ (not given by the paper): "auto" = the first training batch's k-th largest loss.
    lam_momentum : float in (0, 1]
        Stored rules: the running average's weight of each new λ (BatchNorm's momentum); that
        average is λ outside training.
    lam_constraint : {"none", "clamp", "softplus"}
        "gradient" only: how λ >= 0 is kept (not given by the paper); see :mod:`topklab.losses.threshold`.
    scale : {"paper", "atk"}
        ``paper`` = Eq. 5 as printed; ``atk`` multiplies by n/k.
    kernel : {"auto", "native", "compiled", "eager", "triton"}
        ``auto`` = on CUDA wherever Triton imports, a started training call under a rule that sets λ
        runs as Triton launches at every n (:func:`~topklab.losses.aggregate.triton_pass.row_call`
        lists the calls it leaves out); every other call, on rows of >= ``compile_min_n`` losses, the
        C++ kernel on a CPU and the ``torch.compile``-d one on a GPU, falling back where they cannot
        be built; below that the eager kernel. ``triton`` = the launch wherever Triton runs, ``auto``'s
        path for the calls it leaves out. All agree to float32 rounding.
    compile_min_n : int >= 1 or None
        The shortest row that ``auto`` sends to the native or compiled kernel (the Triton launch has
        no minimum). None (default): every row on a CPU, rows of at least 16,384 losses on a GPU.
    dim : int
        The axis of the losses to aggregate (default -1); the other axes are rows.
    rows : int >= 1 or None
        None (default): one stored λ for any number of rows. R: exactly R rows, a λ per row.

    Examples
    --------
    >>> loss = MATk(k=2)
    >>> losses = torch.tensor([1.0, 5.0, 3.0, 0.0], requires_grad=True)
    >>> loss(losses).item(), loss.threshold  # a training call: λ = ℓ_[2] = 3, (2/4)·ATk = 2
    (2.0, tensor(3.))
    >>> tied = torch.tensor([1.0, 3.0, 3.0, 0.0], requires_grad=True)
    >>> torch.autograd.grad(MATk(k=2)(tied), tied)[0]  # (k/n)·ATk's: both tied losses are in the top 2
    tensor([0.0000, 0.2500, 0.2500, 0.0000])
    >>> loss(torch.tensor([[1.0, 5.0, 3.0, 0.0], [4.0, 4.0, 0.0, 0.0]])).tolist()  # rows: each its own λ, 3 and 4
    [2.0, 2.0]
    >>> per_row = MATk(k=2, lam_update="gradient", rows=2)  # a trained λ per row
    >>> per_row(torch.tensor([[1.0, 5.0, 3.0, 0.0], [4.0, 4.0, 0.0, 0.0]])), per_row.threshold.tolist()
    (tensor([2., 2.], grad_fn=<ViewBackward0>), [3.0, 4.0])
    """

    def __init__(self, k: int | float | torch.Tensor, lam_update: str | LambdaRule | None = None, **options):
        super().__init__(k, smoothing="relu", delta=None, lam_update=lam_update, **options)

    def extra_repr(self) -> str:
        return (
            f"k={self.k}, lam_constraint={self.lam_constraint!r}, scale={self.scale!r}{self._kernel_repr()}"
            f"{self._update_repr()}{self._dim_repr()}{self._rows_repr()}"
        )
