"""Running jobs: the Hydra callback that records failed sweep jobs and pins each job to one GPU
(:mod:`topklab.launch.callback`), the failure record (:mod:`~topklab.launch.failures`) and the GPU
choice (:mod:`~topklab.launch.gpu`).

Importing this package prepares Hydra for ``configs/hydra/launcher/``, so the entry points that
start Hydra (``train.py``, the scripts with ``@hydra.main``) import it first (Hydra's job callback,
``configs/hydra/default.yaml``, imports it too): it registers the ``topklab.parallel_jobs``
resolver that ``joblib.yaml`` uses for ``n_jobs`` and the ``topklab.rank_*`` ones with which
``configs/hydra/default.yaml`` keeps torchrun's other ranks out of ``outputs/``
(:mod:`~topklab.launch.ranks`), and silences Hydra's notice that those files share their names with the launchers' own schemas (they
are checked against them, which is what we want).
"""

import warnings

from omegaconf import OmegaConf

from topklab.launch.gpu import parallel_jobs, pinned_gpu
from topklab.launch.ranks import rank_dir, rank_log_file, rank_log_level, rank_subdir

OmegaConf.register_new_resolver("topklab.parallel_jobs", parallel_jobs, replace=True)
for resolver in (rank_dir, rank_subdir, rank_log_file, rank_log_level):
    OmegaConf.register_new_resolver(f"topklab.{resolver.__name__}", resolver, replace=True)
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/\w+' is validated against ConfigStore schema")

__all__ = ["parallel_jobs", "pinned_gpu"]
