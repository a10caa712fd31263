"""What differs between modalities: how a batch's outputs are scored. ``task=tabular`` (binary
error % or RMSE) and ``task=classification`` (top-1/top-5, per class, many/medium/few)."""
from topklab.tasks.classification import ClassificationTask
from topklab.tasks.tabular import TabularTask

__all__ = ["ClassificationTask", "TabularTask"]
