from __future__ import annotations

import torch
from torch import nn

from topklab.operators.difftopk_network import difftopk_module
from topklab.utils.checks import check_int


class SmoothTopKSVM(nn.Module):
    """Per-sample smooth top-k SVM loss of Berrada et al. (ICLR 2018), in its "smooth hard" form:
    samples whose k-th and (k+1)-th scores are far apart (by k·τ·log(threshold)) take the hard top-k
    hinge, the others the smoothed one. Computed with difftopk's port of the authors' code; the
    batch mean equals ``difftopk.SmoothHardTopKLoss`` (tested).

    Parameters
    ----------
    k : int, 1 <= k < classes (Petersen et al. use the P_K's K, i.e. 5)
    tau : float > 0, smoothing temperature; smaller is closer to the hard hinge (difftopk passes
        its ``inverse_temperature`` here: 1 in the CIFAR runs)
    num_classes : int, filled in from the dataset

    Examples
    --------
    >>> SmoothTopKSVM(k=2, tau=1.0, num_classes=4)(torch.zeros(3, 4), torch.tensor([0, 1, 2])).shape
    torch.Size([3])

    References
    ----------
    Berrada, Zisserman & Kumar, "Smooth Loss Functions for Deep Top-k Classification", ICLR 2018, Eq. 10–12.
    """

    def __init__(self, k: int = 5, tau: float = 1.0, num_classes: int | None = None, threshold: float = 1e3):
        super().__init__()
        if num_classes is None:
            raise ValueError("SmoothTopKSVM needs num_classes; use it with a classification dataset")
        check_int("k", k, 1, num_classes - 1, why=f"fewer than the {num_classes} classes")
        if not tau > 0:
            raise ValueError(f"tau={tau} must be > 0 (smaller = closer to the hard top-k hinge)")
        self.k, self.tau, self.threshold, self.num_classes = k, float(tau), float(threshold), num_classes
        self._losses: dict[str, tuple] = {}
        self._detect_large = difftopk_module("difftopk.smooth_topk").detect_large
        self.losses("cpu")

    def losses(self, device) -> tuple:
        """(hard, smooth) loss functions of difftopk's port, whose class labels live on ``device``."""
        key = str(device)
        if key not in self._losses:
            smooth_topk = difftopk_module("difftopk.smooth_topk")
            labels = torch.arange(self.num_classes, device=device)
            self._losses[key] = (
                smooth_topk.Topk_Hard_SVM(labels, self.k, 1.0),
                smooth_topk.Topk_Smooth_SVM(labels, self.k, self.tau, 1.0),
            )
        return self._losses[key]

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.long()
        hard_loss, smooth_loss = self.losses(output.device)
        smooth, hard = self._detect_large(output, self.k, self.tau, self.threshold)
        losses = output.new_zeros(len(target))
        if smooth.any():
            losses = losses.index_put((smooth,), smooth_loss(output[smooth], target[smooth]))
        if hard.any():
            losses = losses.index_put((hard,), hard_loss(output[hard], target[hard]))
        return losses
