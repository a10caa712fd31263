"""Language modelling: the teacher-forced token loss, its perplexity, and how many tokens each
routed block processed."""

from __future__ import annotations

import math

import torch.nn.functional as F

from topklab.data.translation.vocab import PAD
from topklab.tasks.base import Task

SCALARS = ("perplexity", "loss", "routed_fraction")


class LanguageModelingTask(Task):
    """Next-token prediction scored by the mean negative log-likelihood per token and its exponential.

    Metrics (per split): ``loss`` — nats per token (eos included, pad excluded); ``perplexity`` —
    ``exp(loss)``; ``routed_fraction`` — the fraction of tokens the routed blocks processed (mean over
    blocks; None for a dense model) and ``routed_fraction_per_layer``.

    Examples
    --------
    >>> task = LanguageModelingTask()
    >>> task.primary, task.higher_is_better("perplexity")
    ('perplexity', False)
    """

    primary = "perplexity"

    def outputs(self, model, x, y, split: str) -> dict:
        log_probs = F.log_softmax(model(x).float(), dim=-1)
        nll = -log_probs.gather(-1, y[..., None])[..., 0]
        real = y != PAD
        return {"nll": (nll * real).sum(1).double(), "tokens": real.sum(1), "routed": model.last_routed}

    def metrics(self, outputs: dict, references) -> dict:
        tokens = int(outputs["tokens"].sum())
        loss = float(outputs["nll"].sum()) / tokens
        per_layer = (outputs["routed"].sum(0).double() / tokens).tolist()
        return {
            "loss": loss,
            "perplexity": math.exp(loss),
            "tokens": tokens,
            "routed_fraction": sum(per_layer) / len(per_layer) if per_layer else None,
            "routed_fraction_per_layer": per_layer,
        }

    def higher_is_better(self, metric: str) -> bool:
        if metric not in ("perplexity", "loss"):
            raise ValueError(f"select on perplexity or loss (got {metric!r})")
        return False

    def scalar_metrics(self, metrics: dict) -> dict:
        return {k: metrics[k] for k in SCALARS if metrics.get(k) is not None}
