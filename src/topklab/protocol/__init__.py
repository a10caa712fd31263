"""The STk paper's tabular protocol (Sec. 5.1 and 5.3): a hyperparameter grid per aggregate, each
combination trained on many random splits as one population, selected on the split-averaged
validation metric, and stored per (table, dataset, individual loss, aggregate) cell."""

from topklab.protocol.cell import Cell, run_cell, select_combo
from topklab.protocol.grid import Grid
from topklab.protocol.store import CellStore

__all__ = ["Cell", "CellStore", "Grid", "run_cell", "select_combo"]
