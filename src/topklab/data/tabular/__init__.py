"""The STk paper's tabular benchmarks (Table 9), read offline from installed packages."""

from topklab.data.tabular.dataset import TabularDataset, TabularSplits

__all__ = ["TabularDataset", "TabularSplits"]
