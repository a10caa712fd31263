"""What differs between modalities: how a batch's outputs are scored. ``task=tabular`` (binary
error % or RMSE), ``task=classification`` (top-1/top-5, per class, many/medium/few) and
``task=translation`` (decoding, sacreBLEU, chrF), ``task=language_modeling`` (perplexity, tokens routed)."""

from topklab.tasks.classification import ClassificationTask
from topklab.tasks.language_modeling import LanguageModelingTask
from topklab.tasks.search import BeamSearch, GreedySearch
from topklab.tasks.tabular import TabularTask
from topklab.tasks.translation import TranslationTask

__all__ = ["BeamSearch", "ClassificationTask", "GreedySearch", "LanguageModelingTask", "TabularTask", "TranslationTask"]
