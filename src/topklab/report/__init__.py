"""Reports in one place: the result envelope every writer uses (:mod:`~topklab.report.schema`)
and the renderers of every table and figure, which read only ``results/``
(``python -m topklab.report tables|figures``, or ``make tables figures``)."""

from topklab.report.schema import SCHEMA, make_result, read_result, read_results, write_result
from topklab.report.stats import mean_std

__all__ = ["SCHEMA", "make_result", "mean_std", "read_result", "read_results", "write_result"]
