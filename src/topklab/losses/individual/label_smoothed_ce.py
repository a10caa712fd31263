from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LabelSmoothedCrossEntropy(nn.Module):
    """Per-token label-smoothed cross-entropy of a sequence model, padding removed: a 1-D tensor
    with one loss per non-pad target token, in row-major order (the aggregate's "batch").

    ``ℓ = (1 − ε − ε/(V−1))·(−log p_y) + ε/(V−1)·Σ_v (−log p_v)``, i.e. the target gets 1 − ε and
    every other piece ε/(V−1) (fairseq's ``label_smoothed_cross_entropy``; Szegedy et al. 2016).

    Parameters
    ----------
    smoothing : float in [0, 1), ε (0.1 in fairseq's IWSLT/WMT recipes)
    pad_id : int, target id that is not a token (given by the data)

    Examples
    --------
    >>> loss = LabelSmoothedCrossEntropy(smoothing=0.0, pad_id=0)
    >>> loss(torch.zeros(1, 3, 4), torch.tensor([[2, 3, 0]]))   # two tokens, uniform over 4 pieces
    tensor([1.3863, 1.3863])
    """

    def __init__(self, smoothing: float = 0.1, pad_id: int = 0):
        super().__init__()
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"individual.smoothing={smoothing} must lie in [0, 1)")
        self.smoothing, self.pad_id = smoothing, pad_id

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        keep = target != self.pad_id
        logits = output[keep]
        log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        nll = -log_probs.gather(-1, target[keep].long()[:, None])[:, 0]
        if not self.smoothing:
            return nll
        other = self.smoothing / (log_probs.shape[-1] - 1)
        return (1.0 - self.smoothing - other) * nll - other * log_probs.sum(-1)
