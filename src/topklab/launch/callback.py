"""The Hydra callback that makes a sweep survive a failed job and pins each job to one GPU.

Registered in ``configs/hydra/default.yaml`` as ``hydra.callbacks.jobs``. A job whose task function
raises :class:`TopklabError` (bad input found at run time: a non-finite loss, a missing data file):

- in a sweep (``-m``), is recorded in ``<job dir>/FAILED.json`` and handed back to the sweeper as
  finished with the value NaN, so neither the sweeper nor the launcher stops the other jobs; when
  the sweep has ended, the failures are gathered into ``<sweep dir>/failures.jsonl``, listed one line
  each, and the command exits with code 1;
- in a single run, ends the command with ``error: <reason>`` and exit code 2.

Any other exception is a bug and keeps Hydra's own handling (a traceback).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from topklab.config import parse_overrides
from topklab.launch.failures import clear_failures, collect_failures, failure_report, write_failure, write_summary
from topklab.launch.gpu import SWEEP_GPUS, gpu_for_job, gpu_list, pin_gpu, pinned_gpu, visible_gpus
from topklab.utils.errors import TopklabError, fail

log = logging.getLogger(__name__)

# Launchers that run jobs on this machine, where topklab pins GPUs. Cluster launchers
# (submitit_slurm) get their GPUs from the scheduler's allocation, which is left alone.
LOCAL_LAUNCHERS = {
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
}
LOCK_DIR = ".gpu-locks"  # under the sweep's directory


class JobCallback(Callback):
    """Failure records and GPU pinning for every job (see the module docstring).

    ``gpus``: the GPUs a sweep's jobs are spread over (e.g. ``[0, 2]``); null = every visible GPU.
    ``pin_gpus``: false leaves ``CUDA_VISIBLE_DEVICES`` alone (jobs that use several GPUs each).
    """

    def __init__(self, gpus=None, pin_gpus: bool = True):
        self.gpus = gpus
        self.pin_gpus = pin_gpus

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """In the sweep's process, before any job: drop stale failure records and choose the GPUs
        the jobs are spread over (exported in ``TOPKLAB_SWEEP_GPUS`` for the jobs' processes)."""
        clear_failures(config.hydra.sweep.dir)
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # availability checks must not start CUDA
        try:
            devices = gpu_list(self.gpus) or visible_gpus()
        except TopklabError as err:
            fail(f"hydra.callbacks.jobs.{err}")
        local = config.hydra.launcher._target_ in LOCAL_LAUNCHERS
        os.environ[SWEEP_GPUS] = ",".join(devices if self.pin_gpus and local else [])

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """In the job's process, before its task function: pin it to its GPU."""
        devices = [d for d in os.environ.get(SWEEP_GPUS, "").split(",") if d]
        if config.hydra.mode != RunMode.MULTIRUN or not devices:
            return
        job = config.hydra.job.num
        device = pin_gpu(gpu_for_job(job, devices), devices, Path(config.hydra.sweep.dir) / LOCK_DIR)
        if device is None:
            log.warning(f"job {job}: CUDA was initialised before the job started; not pinned to a GPU")
        else:
            log.info(f"job {job} pinned to GPU {device} (CUDA_VISIBLE_DEVICES={device})")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """A sweep job that failed with a TopklabError: record it and let the sweep go on."""
        if config.hydra.mode != RunMode.MULTIRUN or not _user_error(job_return):
            return
        err = job_return._return_value
        write_failure(config.hydra.runtime.output_dir, config.hydra.job.num, job_return.overrides, err, pinned_gpu())
        log.error(f"job {config.hydra.job.num} failed: {err}")
        job_return.status = JobStatus.COMPLETED  # handled: the sweeper must not re-raise it
        job_return.return_value = math.nan  # what a sweeper that optimises a metric sees

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """After the last job: list the failed jobs and exit non-zero if there are any."""
        failures = collect_failures(config.hydra.sweep.dir)
        if failures:
            summary = write_summary(config.hydra.sweep.dir, failures)
            swept = {
                o.get_key_element() for o in parse_overrides(list(config.hydra.overrides.task)) if o.is_sweep_override()
            }
            print(failure_report(failures, summary, swept), file=sys.stderr)
            raise SystemExit(1)

    def on_run_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """A single run that failed with a TopklabError ends with its one-line error (exit 2)."""
        if _user_error(job_return):
            fail(job_return._return_value)


def _user_error(job_return: JobReturn) -> bool:
    """The job failed because of bad input (a TopklabError), not a bug. (``_return_value`` holds the
    exception; the ``return_value`` property would raise it.)"""
    return job_return.status == JobStatus.FAILED and isinstance(job_return._return_value, TopklabError)
