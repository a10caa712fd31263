"""Top-k gradient sparsification with error feedback (see :mod:`.exchange`) and its selectors."""

from topklab.sparsification.exchange import SparseGradientExchange
from topklab.sparsification.selectors import ExactTopK, SampledThreshold, STkThresholdSelector

__all__ = ["SparseGradientExchange", "ExactTopK", "SampledThreshold", "STkThresholdSelector"]
