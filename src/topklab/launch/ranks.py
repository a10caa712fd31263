"""Under torchrun, the ranks other than 0 keep Hydra's run directory and log lines out of
``outputs/`` and the console: rank 0 writes the run's one record. ``configs/hydra/default.yaml``
reads these through the ``topklab.rank_*`` resolvers that :mod:`topklab.launch` registers.

Examples
--------
>>> import os
>>> os.environ["RANK"] = "1"; rank_subdir(".hydra") is None, rank_log_level("INFO"), rank_log_file("x/train.log")
(True, 'WARNING', '/dev/null')
>>> os.environ["RANK"] = "0"; rank_dir("outputs/train/runs/x"), rank_subdir(".hydra"), rank_log_level("INFO")
('outputs/train/runs/x', '.hydra', 'INFO')
>>> del os.environ["RANK"]
"""

from __future__ import annotations

import os
import tempfile


def rank() -> int:
    """This process's rank under torchrun (``RANK``), 0 without it."""
    return int(os.environ.get("RANK", "0"))


def rank_dir(main_dir: str) -> str:
    """Hydra's run directory: ``main_dir`` on rank 0, a folder of the rank's own in the system's
    temporary directory on the others."""
    return main_dir if rank() == 0 else f"{tempfile.gettempdir()}/topklab-rank{rank()}"


def rank_subdir(subdir: str | None) -> str | None:
    """Hydra's ``output_subdir`` (the saved config): ``subdir`` on rank 0, none on the others."""
    return subdir if rank() == 0 else None


def rank_log_file(path: str) -> str:
    """The job's log file: ``path`` on rank 0, the null device on the others (a ``hydra.run.dir``
    given on the command line is every rank's)."""
    return path if rank() == 0 else os.devnull


def rank_log_level(level: str) -> str:
    """The job's root log level: ``level`` on rank 0, WARNING on the others (their INFO lines would
    repeat rank 0's)."""
    return level if rank() == 0 else "WARNING"
