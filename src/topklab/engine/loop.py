"""The one training loop of every per-model run: tabular, image classification, and whatever Task
plugs in next.

Per step: a batch from the Data's loader, the model (under autocast when asked), the Objective,
backward, optimizer, scheduler. Validation runs every ``eval_every_steps`` steps or at the end of
each epoch; each selection metric keeps its best-validation state, and the first one's patience
stops training. Per epoch: a summary row (metrics and cost figures) and a checkpoint. A restarted
run with the same config continues from its last checkpoint and, on CPU, ends with exactly the
metrics of an uninterrupted run: an epoch's randomness derives from (seed, epoch), and every
piece of state (model, λ, optimizer, scheduler, scaler, RNG, running sums, trackers, best states,
logger id) is in the checkpoint. Reported metrics come from the best-validation state.

:meth:`Engine.fit` reads as the loop itself: a :class:`TrainingRun` is opened (resumed from its
checkpoint when there is one) and started, then each epoch is ``train_one_epoch`` (``train_step``
per batch, ``_after_step`` for step-level validation, checkpoints and signals) and ``end_epoch``
(finite check, validation, the epoch row, checkpoint), and ``finish`` scores the selected states.
DDP, micro-batches, gradient exchange, checkpoint averaging and finite checks are hooks beside it
(:mod:`topklab.engine.hooks`).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from topklab.engine.checkpoint import TRAINING_STATE, CheckpointStore, not_this_run, state_mismatch
from topklab.engine.distributed import Distributed, gather_concat
from topklab.engine.hooks import CheckpointAveraging, FiniteGuard, MicroBatches, Replicas, average_states, batch_plan  # noqa: F401
from topklab.engine.interrupt import pending_signal
from topklab.engine.objective import TrainingModule
from topklab.engine.profiling import StepProfile, peak_memory_bytes, torch_profiler
from topklab.engine.run_identity import check_resumable, segment_identity
from topklab.engine.schedules import LRFactor
from topklab.engine.stopping import REPORT_STATES, EarlyStopping
from topklab.losses.aggregate.lambda_monitor import lambda_tracking
from topklab.utils.checks import check_int
from topklab.utils.device import resolve_device
from topklab.utils.errors import Interrupted, TopklabError
from topklab.utils.seed import rng_state, set_rng_state

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
SPLITS = ("train", "val", "test")


def concat_outputs(batches: list) -> torch.Tensor | dict:
    """A split's outputs from its batches' (tensors, or dicts of tensors), every rank's rows
    gathered in rank order under DDP."""
    if isinstance(batches[0], dict):
        return {key: torch.cat([gather_concat(b[key]) for b in batches]) for key in batches[0]}
    return torch.cat([gather_concat(b) for b in batches])


SIZE_SETTINGS = {  # the dataset settings that decide how many examples a split gets (ratios, subsets, filters)
    "train": ("split", "holdout", "val_fraction", "val_per_class", "n_max", "max_length"),
    "val": ("split", "holdout", "val_fraction", "val_per_class"),
    "test": ("split",),
}
SOURCE_SETTINGS = ("files", "lists", "splits", "split_dir", "root")  # where a split's examples are read from


def check_splits(data, splits, dataset_cfg=None) -> None:
    """Every split of ``splits`` the engine trains on, validates or scores has examples; an empty one
    is a one-line :class:`TopklabError` naming it, the dataset and the settings that fill it
    (``dataset_cfg``: the dataset's config, whose keys are named when given), before training.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> data = SimpleNamespace(name="sinc", targets=lambda split: [0.5] * {"train": 6, "val": 4, "test": 0}[split])
    >>> check_splits(data, ["train", "val", "test"], {"split": [0.6, 0.39, 0.01], "source": {}})
    Traceback (most recent call last):
    ...
    topklab.utils.errors.TopklabError: dataset sinc: the test split is empty (train 6, val 4, test 0 examples); give it examples with dataset.split
    """
    sizes = {split: len(data.targets(split)) for split in dict.fromkeys(["train", "val", *splits])}
    empty = next((split for split in sizes if split in splits and sizes[split] == 0), None)
    if empty is None:
        return
    counts = ", ".join(f"{split} {n}" for split, n in sizes.items())
    keys = list(dataset_cfg or {})
    fix = [f"dataset.{key}" for key in SIZE_SETTINGS[empty] if key in keys]
    source = next((key for key in SOURCE_SETTINGS if key in keys), None)
    hints = ([f"give it examples with {' or '.join(fix)}"] if fix else []) + (
        [f"check its data under dataset.{source}={dataset_cfg[source]}"] if source else []
    )
    raise TopklabError(
        f"dataset {data.name}: the {empty} split is empty ({counts} examples); "
        f"{' or '.join(hints) or 'check the dataset and its split settings'}"
    )


STORED_AS_GIVEN = (
    "epochs", "batch_size", "eval_batch_size", "micro_batch_size", "drop_last", "eval_every_steps", "validate_at_start",
    "patience", "min_delta", "report_state", "amp", "channels_last", "clip_grad_norm", "average_last", "checkpoint",
    "checkpoint_every", "resume", "max_steps", "progress", "finite_check", "gradient_exchange",
)  # fmt: skip


def check_engine_settings(settings: dict) -> None:
    """A one-line ValueError for the first of :class:`Engine`'s settings that is out of range."""
    check_int("engine.epochs", settings["epochs"])
    check_int("engine.batch_size", settings["batch_size"])
    for name in ("eval_batch_size", "micro_batch_size", "eval_every_steps", "patience", "max_steps"):
        check_int(f"engine.{name}", settings[name], allow_none=True)
    check_int("engine.average_last", settings["average_last"], 0)
    choices = {"report_state": REPORT_STATES, "finite_check": ("auto", "step", "epoch"), "amp": tuple(AMP_DTYPES),
               "channels_last": ("auto", True, False), "resume": (True, False, "force")}  # fmt: skip
    for name, allowed in choices.items():
        if settings[name] not in allowed:
            names = ", ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in allowed)
            raise ValueError(f"engine.{name}={settings[name]!r}; choose one of {names}")
    if not settings["min_delta"] >= 0 or settings["checkpoint_every"] < 0 or not settings["clip_grad_norm"] >= 0:
        raise ValueError("engine.min_delta, engine.checkpoint_every and engine.clip_grad_norm must be >= 0")
    if settings["average_last"] and not settings["checkpoint"]:
        raise ValueError("engine.average_last needs engine.checkpoint=true (the epoch weights are kept beside it)")
    if settings["select_metrics"] is not None and not list(settings["select_metrics"]):
        raise ValueError("engine.select_metrics is empty; give metric names or null for the task's primary metric")
    final_splits = list(settings["final_splits"])
    if set(final_splits) - set(SPLITS) or "val" not in final_splits:
        raise ValueError(f"engine.final_splits={final_splits} must include val and name only {', '.join(SPLITS)}")
    if settings["gradient_exchange"] is not None and settings["micro_batch_size"]:
        raise ValueError(
            "engine.gradient_exchange already splits each batch into its workers' shards; set engine.micro_batch_size=null"
        )


class Engine:
    """Trains one model on ``objective(model(x), y)`` with a Data, a Task and an optimizer.

    Parameters
    ----------
    epochs : int >= 1, epochs at most (and the length of the schedule)
    batch_size : int >= 1; eval_batch_size : int >= 1 or None (None: a split in one batch)
    micro_batch_size : int >= 1 or None, run each batch as forward/backward passes over chunks of
        this many samples and step once (gradient accumulation: one optimizer step per batch of
        ``batch_size``); chunk c's objective is weighted by n_c / n. That is the batch's objective
        exactly for Average and for MATk/STk with a trainable λ (``lam_update=gradient``: λ +
        (1/k)·Σφ(ℓ − λ) with k a fraction of the batch is a sum over samples), and per chunk for
        ATk and for a solved λ (``lam_update=solve``), whose top-k or root is taken within a chunk
        (as PEL/LIFT's accumulation takes every batch-level aggregate). None: the whole batch at once
    drop_last : bool, drop an incomplete last training batch
    eval_every_steps : int >= 1 or None, validate every this many steps (the STk paper's tabular
        protocol: 1); None validates at the end of each epoch
    validate_at_start : bool, score the initial state as a candidate best (step 0), so training
        can roll back to it
    patience : int >= 1 or None, stop once the first selection metric has not improved for this
        many steps (STk paper: 50); None trains all epochs
    min_delta : float >= 0, the smallest change of a selection metric that counts as improving
    select_metrics : list of metric names or None (the task's primary metric); each keeps its own
        best-validation state, whose test metrics it reports; ties keep the earlier state
    report_state : best | last, which state the reported metrics come from: each selection
        metric's best-validation state, or the final state for every metric (PEL/LIFT report the
        last epoch); validation still runs and is logged either way
    final_splits : splits scored with each selected state (train, val, test)
    device : auto | cpu | cuda[:i]
    amp : none | bf16 | fp16, autocast dtype of the model (fp16 adds a GradScaler); the objective
        runs in float32
    channels_last : auto | true | false (auto: on CUDA only)
    schedule : dict of :class:`~topklab.engine.schedules.LRFactor` fields (name constant | cosine |
        step | inverse_sqrt, warmup_epochs, warmup_steps, milestones, gamma, min_lr_ratio, per_epoch);
        evaluated every batch
    clip_grad_norm : float >= 0, clip the gradient's global norm (model and λ) to this (0: off)
    average_last : int >= 0, also score the average of the last N epoch-end weights (fairseq's
        ``average_checkpoints``) on val and test, reported under ``averaged`` (0: off; needs
        ``checkpoint``, since the epoch weights are kept beside it)
    checkpoint : bool, keep a resumable checkpoint under the run key (written each epoch end)
    checkpoint_every : int >= 0, also checkpoint every this many steps (0: at epoch ends only)
    resume : bool or "force", continue from the run key's checkpoint when one exists, provided the code
        that shapes training, the machine settings that change its numbers (device, threads, CPU
        kernels, kernel-choosing environment variables, torch) and the data files read are those it was
        written with (:mod:`~topklab.engine.run_identity`); "force" resumes under other ones. Each
        segment of a run is kept in the summary's ``segments`` with its step range, ``forced`` where
        it went on under another identity
    max_steps : int >= 1 or None, stop after this many steps (smoke runs, profiling)
    profiler : dict(enabled, wait, warmup, active), torch.profiler over the first steps; the Chrome
        trace goes to ``<run dir>/profile/trace.json``
    progress : bool, a tqdm bar per epoch
    deterministic : bool, deterministic kernels only and cuDNN without autotuning for the run
        (:func:`~topklab.utils.seed.deterministic_algorithms`): a CUDA run then repeats bit for bit
        and resumes exactly, at some speed; a CPU run is deterministic either way
    finite_check : auto | step | epoch, when a non-finite loss is caught: at every step (the state
        kept in ``last_good.pt`` is the one before the failing update) or at epoch ends and
        checkpoints only (no per-step device sync; ``last_good.pt`` is then the last finite
        checkpoint's state); auto: every step on a CPU in one process, else at epoch ends
    gradient_exchange : :class:`~topklab.sparsification.SparseGradientExchange` or None, simulate
        data-parallel workers that each send only k gradient entries (error feedback): every batch
        is split into its workers' shards, and the optimizer steps with the sum of their messages;
        each epoch row adds ``sent_fraction``, ``selection_s`` and ``residual_norm``
    """

    def __init__(
        self,
        epochs: int = 200,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        micro_batch_size: int | None = None,
        drop_last: bool = False,
        eval_every_steps: int | None = None,
        validate_at_start: bool = False,
        patience: int | None = None,
        min_delta: float = 0.0,
        select_metrics=None,
        report_state: str = "best",
        final_splits=("val", "test"),
        device: str = "auto",
        amp: str = "none",
        channels_last="auto",
        schedule: dict | None = None,
        clip_grad_norm: float = 0.0,
        average_last: int = 0,
        checkpoint: bool = True,
        checkpoint_every: int = 0,
        resume: bool = True,
        max_steps: int | None = None,
        profiler: dict | None = None,
        progress: bool = True,
        gradient_exchange=None,
        finite_check: str = "auto",
        deterministic: bool = False,
    ):
        settings = {name: value for name, value in locals().items() if name != "self"}
        check_engine_settings(settings)
        self._store(**settings)

    def _store(self, **settings) -> None:
        """Keep the checked settings (:func:`check_engine_settings`) under the names the loop reads."""
        for name in STORED_AS_GIVEN:
            setattr(self, name, settings[name])
        self.device_name, self.deterministic = settings["device"], bool(settings["deterministic"])
        metrics = settings["select_metrics"]
        self.select_metrics = None if metrics is None else list(metrics)
        self.final_splits = list(settings["final_splits"])
        self.schedule = dict(settings["schedule"] or {"name": "constant"})
        LRFactor(steps_per_epoch=1, epochs=self.epochs, **self.schedule)  # validates the fields now
        self.profiler = {"enabled": False, "wait": 1, "warmup": 1, "active": 3, **(settings["profiler"] or {})}

    def fit(
        self,
        module: TrainingModule,
        optimizer: torch.optim.Optimizer,
        data,
        task,
        seed: int,
        on_epoch_end: Callable[[dict], None] = lambda row: None,
        on_eval: Callable[[dict], None] = lambda row: None,
        replay_logged: Callable[[list[dict]], None] = lambda rows: None,
        workdir: str | Path | None = None,
        run_dir: str | Path | None = None,
        logger_id: str | None = None,
        dist: Distributed | None = None,
        data_fingerprint: str | None = None,
    ) -> dict:
        """Train, select, and score the selected states; returns the run's summary fields.

        ``data_fingerprint`` (:mod:`topklab.data.fingerprint`) joins the checkpoint's record of what
        wrote it, so a resume on other data files is refused.

        ``on_eval`` receives each logged row; the rows are kept in the checkpoint, and a resumed run
        hands all of them to ``replay_logged`` first, so a log rebuilt from them equals an
        uninterrupted run's whatever moment the kill came.

        Under ``torchrun`` (``dist`` from :meth:`Distributed.from_env`), every rank draws the same
        global batch and trains on its contiguous slice with DistributedDataParallel; evaluation
        outputs are gathered, so every rank computes the same metrics; only the main rank writes
        checkpoints (see :mod:`topklab.engine.distributed` for what k means under DDP).
        """
        run = TrainingRun(
            self, module, optimizer, data, task, seed, dist or Distributed(), (on_epoch_end, on_eval, replay_logged)
        )
        run.open(workdir, logger_id, data_fingerprint)
        run.start(run_dir)
        with run.profiler:
            for epoch in run.remaining_epochs():
                run.train_one_epoch(epoch)
                if run.end_epoch(epoch):
                    break
        return run.finish()

    def _chunks(self, n: int) -> list[slice]:
        """The micro-batches of a batch of ``n`` samples (one chunk without ``micro_batch_size``)."""
        return MicroBatches(self.micro_batch_size).chunks(n)

    def _score_selected(self, module, state, select, evaluate, device, channels_last) -> dict:
        """Test (and train) metrics of each selection metric's best state; the module ends in the
        first metric's best state."""
        results, scored = {}, {}
        for metric in select:
            best = state["best"][metric]
            if best["step"] not in scored:  # metrics that selected the same state share one pass
                module.load_state_dict(best["state"])
                scored[best["step"]] = {split: evaluate(split) for split in self.final_splits if split != "val"}
            results[metric] = {"epoch": best["epoch"], "step": best["step"], "val": best["val"], **scored[best["step"]]}
        module.load_state_dict(state["best"][select[0]]["state"])
        primary = results[select[0]]
        last = state["history"][-1]
        return {
            "metrics": {split: primary[split] for split in SPLITS if split in self.final_splits},
            "selection": {
                m: {"epoch": r["epoch"], "step": r["step"], **{s: r[s][m] for s in self.final_splits}}
                for m, r in results.items()
            },
            "best_step": primary["step"],
            "best_epoch": primary["epoch"],
            "steps": state["step"],
            "epochs": state["epoch"],
            "early_stopped": state["early_stopped"],
            "lambda": module.objective.threshold,
            "lambda_tracking": lambda_tracking(state["history"])
            if hasattr(module.objective.aggregate, "monitor")
            else None,
            "train_seconds": state["train_seconds"],
            "segments": step_ranges(state["segments"], state["step"]),
            "device": str(device),
            "amp": self.amp,
            "channels_last": channels_last,
            "cost": {
                k: last[k]
                for k in (
                    "step_time_s",
                    "images_per_s",
                    "losses_per_s",
                    "data_wait_share",
                    "loss_share",
                    "peak_memory_mb",
                )
            },
            "history": state["history"],
        }


SEGMENT_PLACE = ("from_step", "to_step", "forced")  # a segment's place in its run, beside its identity


def step_ranges(segments: list[dict], last_step: int) -> list[dict]:
    """Each segment of a run with the step it ended at (``to_step``: where the next one took over, or
    the run's last step); a segment resumed under another identity (``engine.resume=force``) says
    ``forced``.

    Examples
    --------
    >>> step_ranges([{"code": "a", "from_step": 0}, {"code": "b", "from_step": 40, "forced": True}], 90)
    [{'code': 'a', 'from_step': 0, 'to_step': 40}, {'code': 'b', 'from_step': 40, 'forced': True, 'to_step': 90}]
    """
    ends = [segment["from_step"] for segment in segments[1:]] + [last_step]
    return [{**segment, "to_step": end} for segment, end in zip(segments, ends, strict=True)]


class TrainingRun:
    """One call of :meth:`Engine.fit`: the pieces it trains with and the progress it checkpoints.

    ``state`` is the checkpointed progress (epoch, batch, step, running loss sum, history, best
    states, trackers, timings, logged rows, segments); ``plan`` splits each batch
    (:class:`~topklab.engine.hooks.MicroBatches` or gradient-exchange shards), ``replicas`` is what
    DDP adds, ``guard`` the finite checks and ``averaging`` the checkpoint averaging.
    """

    def __init__(
        self, engine: Engine, module: TrainingModule, optimizer, data, task, seed: int, dist: Distributed, callbacks
    ):
        if engine.micro_batch_size and dist.is_distributed and module.objective.gather_losses:
            raise ValueError(
                "engine.micro_batch_size with objective.gather_losses under DDP would gather a different "
                "number of chunks per rank; use one of the two"
            )
        if engine.gradient_exchange is not None and dist.is_distributed:
            raise ValueError("engine.gradient_exchange simulates its workers in one process; run it without torchrun")
        self.engine, self.module, self.optimizer, self.data, self.task = engine, module, optimizer, data, task
        self.dist, self.replicas = dist, Replicas(dist)
        self.on_epoch_end, self.on_eval, self.replay_logged = callbacks
        self.plan = batch_plan(engine.micro_batch_size, engine.gradient_exchange)
        device = resolve_device(engine.device_name)
        self.device = dist.device if dist.is_distributed and device.type == "cuda" else device
        self.channels_last = (
            self.device.type == "cuda" if engine.channels_last == "auto" else bool(engine.channels_last)
        )
        self.amp_dtype = AMP_DTYPES[engine.amp]
        self.select = engine.select_metrics or [task.primary]
        self.signs = {metric: 1.0 if task.higher_is_better(metric) else -1.0 for metric in self.select}
        module.model.to(self.device, memory_format=torch.channels_last if self.channels_last else torch.preserve_format)
        module.objective.to(self.device)
        self.plan.attach(module, self.device)
        check_splits(data, ["train", "val", *engine.final_splits])
        self.wrapped = dist.wrap(module)
        self.train_loader = data.train_loader(
            engine.batch_size, engine.drop_last, seed, self.device, self.channels_last
        )
        self.scheduler = self._scheduler(len(self.train_loader))
        self.monitor = getattr(module.objective.aggregate, "monitor", None)
        if self.monitor is not None:  # λ in band counts the calls after the first 10 % of the run's
            planned = len(self.train_loader) * engine.epochs
            planned = planned if engine.max_steps is None else min(engine.max_steps, planned)
            self.monitor.burn_in = planned * len(self.plan.chunks(engine.batch_size)) // 10
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=engine.amp == "fp16")
        self.loaders = {}

    def _scheduler(self, steps_per_epoch: int):
        """The LR schedule, evaluated every batch; a group with constant_lr (λ under lam_lr) keeps its rate."""
        factor = LRFactor(steps_per_epoch=steps_per_epoch, epochs=self.engine.epochs, **self.engine.schedule)
        constant = LRFactor("constant", steps_per_epoch=steps_per_epoch, epochs=self.engine.epochs)
        return torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, [constant if group.get("constant_lr") else factor for group in self.optimizer.param_groups]
        )

    def autocast(self):
        return (
            contextlib.nullcontext()
            if self.amp_dtype is None
            else torch.autocast(self.device.type, dtype=self.amp_dtype)
        )

    def snapshot(self) -> dict:
        return {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}

    def evaluate(self, split: str) -> dict:
        """The task's metrics of the current state on ``split`` (every rank's outputs gathered)."""
        self.replicas.sync_buffers(self.module)
        if split not in self.loaders:
            self.loaders[split] = self.data.eval_loader(
                split, self.engine.eval_batch_size, self.device, self.channels_last
            )
        self.module.eval()
        local = self.replicas.local
        with torch.no_grad(), self.autocast():
            outputs = concat_outputs(
                [
                    self.task.outputs(self.module.model, local(x), local(y), split)
                    for x, y in self.loaders[split].batches()
                ]
            )
        self.module.train()
        return self.task.metrics(outputs, self.data.targets(split))

    # -- progress, checkpoint and resume ---------------------------------------------------------

    def open(self, workdir, logger_id: str | None, data_fingerprint: str | None = None) -> None:
        """Fresh progress, the trackers and the checkpoint store; resumed from it when asked. ``data_fingerprint``:
        the data the run reads (:func:`~topklab.engine.run.data_fingerprint`; None: files not named), in its identity."""
        engine = self.engine
        self.identity = segment_identity(self.device, data_fingerprint)
        self.state = {
            "epoch": 0,
            "batch": 0,
            "step": 0,
            "loss_sum": 0.0,
            "history": [],
            "best": {},
            "trackers": None,
            "train_seconds": 0.0,
            "logger_id": logger_id,
            "finished": False,
            "early_stopped": False,
            "segments": [{**self.identity, "from_step": 0}],
            "logged": [],
        }
        self.trackers = {
            m: EarlyStopping(
                torch.tensor([-float("inf")], dtype=torch.float64),
                engine.patience if i == 0 else None,
                engine.min_delta,
            )
            for i, m in enumerate(self.select)
        }
        self.store = CheckpointStore(workdir) if workdir is not None and engine.checkpoint else None
        if self.store is not None and self.dist.is_main:
            self.store.remove_stale_temporaries()
        self.averaging = CheckpointAveraging(engine.average_last, self.store, self.dist.is_main)
        if self.store is not None and engine.resume and self.store.exists():
            self._resume(self.store.load(), logger_id)

    def _checkpoint_parts(self) -> dict:
        return {
            "module": self.module,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            **self.plan.checkpoint_parts(),
        }

    def _resume(self, saved, logger_id: str | None) -> None:
        """Continue from a checkpoint of this run: checked whole, then every part loaded."""
        store = self.store
        lacking = [
            key
            for key in (*TRAINING_STATE, *self.plan.checkpoint_parts())
            if not isinstance(saved, dict) or key not in saved
        ]
        if lacking:
            raise not_this_run(store.path, f"it is not a training checkpoint of this engine: no {', '.join(lacking)}")
        segments = saved["progress"].get("segments")
        previous = {k: v for k, v in segments[-1].items() if k not in SEGMENT_PLACE} if segments else None
        check_resumable(previous, self.identity, store.directory, force=self.engine.resume == "force")
        mismatch = state_mismatch(saved["module"], self.module.state_dict())
        if mismatch:  # checked before loading: the model is not left half-loaded
            raise not_this_run(store.path, f"another model wrote it: {mismatch}")
        for part, target in self._checkpoint_parts().items():
            try:
                target.load_state_dict(saved[part])
            except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as err:
                raise not_this_run(
                    store.path, f"its {part} state does not load: {' '.join(str(err).split())[:200]}"
                ) from None
        set_rng_state(saved["rng"])
        self.state = state = saved["progress"]
        forced = {"forced": True} if previous != self.identity else {}  # resumed under another identity
        state["segments"] = [*(segments or []), {**self.identity, "from_step": state["step"], **forced}]
        state["logger_id"] = logger_id or state.get("logger_id")
        self._restore_progress(state)

    def _restore_progress(self, state: dict) -> None:
        """The λ monitor and trackers from a resumed run's progress; its rows handed on again."""
        if self.monitor is not None and "lambda_monitor" in state:
            self.monitor.load_state_dict(state["lambda_monitor"])
        for metric, tracker in self.trackers.items():
            tracker.load_state_dict(state["trackers"][metric])
        for row in state["history"]:
            self.on_epoch_end(row)
        state.setdefault("logged", [])
        self.replay_logged(state["logged"])

    def save_checkpoint(self) -> None:
        """The whole state of the run (main rank only), after checking its loss sum is finite."""
        if self.store is None:
            return
        state = self.state
        loss_sum = self.replicas.loss_sum(self.running)  # every rank: a collective under DDP
        self.guard.check(f"before the checkpoint at step {state['step']}", loss_sum, state["step"])
        if not self.dist.is_main:
            return
        state["loss_sum"] = float(loss_sum)
        state["trackers"] = {m: t.state_dict() for m, t in self.trackers.items()}
        if self.monitor is not None:
            state["lambda_monitor"] = self.monitor.state_dict()
        parts = self._checkpoint_parts()
        self.store.save(
            {
                **{name: parts[name].state_dict() for name in ("module", "optimizer", "scheduler", "scaler")},
                "rng": rng_state(),
                "progress": state,
                **{name: target.state_dict() for name, target in self.plan.checkpoint_parts().items()},
            },
            {
                "epoch": state["epoch"],
                "batch": state["batch"],
                "step": state["step"],
                "logger_id": state["logger_id"],
                "finished": state["finished"],
                "segments": state["segments"],
            },
        )

    # -- validation and selection ----------------------------------------------------------------

    def log(self, row: dict) -> None:
        self.state["logged"].append(row)
        self.on_eval(row)

    def record_validation(self, val: dict, epoch: int) -> bool:
        """Update every metric's best state; True when the first metric's patience ran out."""
        state, stop, best_state = self.state, False, None
        for i, metric in enumerate(self.select):
            score = torch.tensor([self.signs[metric] * val[metric]], dtype=torch.float64)
            improved, out_of_patience = self.trackers[metric].update(state["step"], score)
            if bool(improved):
                # report_state=last replaces the best states at the end: no copy of the weights per improvement
                best_state = best_state or (self.snapshot() if self.engine.report_state == "best" else None)
                state["best"][metric] = {
                    "value": val[metric],
                    "epoch": epoch,
                    "step": state["step"],
                    "val": val,
                    "state": best_state,
                }
            stop = stop or (i == 0 and bool(out_of_patience))
        if self.engine.eval_every_steps:  # epoch-level validation logs the whole epoch row instead
            self.log(
                {
                    "step": state["step"],
                    "epoch": epoch,
                    **{f"val_{k}": v for k, v in self.task.scalar_metrics(val).items()},
                    "lambda": self.module.objective.threshold,
                }
            )
        return stop

    # -- training --------------------------------------------------------------------------------

    def start(self, run_dir) -> None:
        """The finite guard and running loss sum, data-dependent initialisation, the optional
        step-0 validation, and the profilers."""
        engine, state, device = self.engine, self.state, self.device
        each_step = (
            device.type != "cuda" and not self.dist.is_distributed
            if engine.finite_check == "auto"
            else engine.finite_check == "step"
        )  # no per-step sync on a GPU or across ranks
        self.guard = FiniteGuard(each_step, self.snapshot, state["step"])
        self.running = torch.tensor(state["loss_sum"], dtype=torch.float64, device=device)
        if state["step"] == 0 and hasattr(self.module.model, "initialise_from_data"):  # e.g. a head from class means
            self.module.eval()
            with torch.no_grad(), self.autocast():
                self.module.model.initialise_from_data(self.data, device)
            self.module.train()
        if engine.validate_at_start and state["step"] == 0 and not state["best"]:
            self.record_validation(self.evaluate("val"), 0)
        self.profile = StepProfile(device)
        self.profiler = torch_profiler(engine.profiler, run_dir)
        self.module.train()

    def remaining_epochs(self) -> range:
        return range(self.state["epoch"], self.engine.epochs if not self.state["finished"] else self.state["epoch"])

    def train_one_epoch(self, epoch: int) -> None:
        """The epoch's batches from the current one, until its end, early stopping or max_steps."""
        self.profile.reset()
        self.plan.start_epoch()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.epoch_start = time.perf_counter()
        bar = tqdm(
            total=len(self.train_loader),
            initial=self.state["batch"],
            desc=f"epoch {epoch + 1}/{self.engine.epochs}",
            disable=not self.engine.progress,
            leave=False,
        )
        self.val, self.validated_step = None, None
        fetch_start = time.perf_counter()
        for x, y in self.train_loader.batches(epoch, start=self.state["batch"]):
            if len(y) < self.dist.world_size:  # a last batch too small to give every rank a sample
                break
            self.train_step(x, y, epoch, time.perf_counter() - fetch_start)
            bar.update(1)
            if self._after_step(epoch):
                break
            fetch_start = time.perf_counter()
        bar.close()

    def train_step(self, x: torch.Tensor, y: torch.Tensor, epoch: int, waited: float) -> None:
        """One optimizer step on a batch: a forward/backward pass per chunk of the plan, then the step."""
        profile, scaler, state = self.profile, self.scaler, self.state
        compute_start = profile.now()
        self.optimizer.zero_grad(set_to_none=True)
        x, y = self.replicas.local(x), self.replicas.local(y)
        chunks = self.plan.chunks(len(y))
        objective, loss_spans, counted = torch.zeros((), dtype=torch.float64, device=self.device), [], 0
        for c, part in enumerate(chunks):
            sync = c == len(chunks) - 1 or not self.dist.is_distributed
            weight = (part.stop - part.start) / len(y)
            chunk_objective, span, count = self._chunk_backward(x[part], y[part], weight, sync, epoch)
            loss_spans.append(span)
            counted += count
            self.plan.collected(c, scaler)
            objective += chunk_objective.detach().double() * weight
        self.plan.before_step(scaler)
        if self.engine.clip_grad_norm:
            scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.engine.clip_grad_norm)
        scaler.step(self.optimizer)
        scaler.update()
        self.scheduler.step()
        profile.step(waited, loss_spans, compute_start, profile.now(), len(y), counted)
        self.profiler.step()
        state["step"] += 1
        state["batch"] += 1
        self.running += objective

    def _chunk_backward(self, x, y, weight: float, sync: bool, epoch: int):
        """Forward and weighted backward of one chunk (DDP syncs gradients at the last one only);
        returns its objective, its loss span (for the step profile) and its count of losses."""
        with contextlib.nullcontext() if sync else self.wrapped.no_sync():
            chunk_objective, _ = self.wrapped(x, y, self.autocast, self.profile.now)
            span, count = (self.module.loss_start, self.profile.now()), self.module.objective.last_count
            self.guard.check_chunk(chunk_objective, epoch, self.state["step"])
            self.scaler.scale(chunk_objective * weight).backward()
        return chunk_objective, span, count

    def _after_step(self, epoch: int) -> bool:
        """Step-level validation, checkpoint and signal check; True when the epoch stops here."""
        engine, state = self.engine, self.state
        if engine.eval_every_steps and state["step"] % engine.eval_every_steps == 0:
            self.val, self.validated_step = self.evaluate("val"), state["step"]
            if self.record_validation(self.val, epoch + 1):
                state["early_stopped"] = state["finished"] = True
                return True
        if engine.checkpoint_every and state["step"] % engine.checkpoint_every == 0:
            state["train_seconds"] += time.perf_counter() - self.epoch_start
            self.epoch_start = time.perf_counter()
            self.save_checkpoint()
        if self.replicas.interrupted():
            self._stop_for_signal(epoch)
        if engine.max_steps is not None and state["step"] >= engine.max_steps:
            state["finished"] = True
            return True
        return False

    def _stop_for_signal(self, epoch: int) -> None:
        """Checkpoint and raise :class:`Interrupted` for the signal that arrived."""
        self.state["train_seconds"] += time.perf_counter() - self.epoch_start
        self.save_checkpoint()
        number = pending_signal() or signal.SIGTERM
        saved = (
            f"checkpoint saved in {self.store.directory}; rerun the same command to resume"
            if self.store is not None
            else "nothing saved (engine.checkpoint=false)"
        )
        raise Interrupted(
            f"{signal.Signals(number).name} at epoch {epoch + 1}, step {self.state['step']}: {saved}", number
        )

    def end_epoch(self, epoch: int) -> bool:
        """The epoch's finite check, validation, row, kept weights and checkpoint; True when training ends."""
        engine, state = self.engine, self.state
        cost = self.profile.summary()
        peak_mb = peak_memory_bytes(self.device) / 2**20
        loss_sum = self.replicas.loss_sum(self.running)
        self.guard.check(f"in epoch {epoch + 1}", loss_sum, state["step"])
        if self.validated_step != state["step"]:
            self.val = self.evaluate("val")
            if not engine.eval_every_steps and self.record_validation(self.val, epoch + 1):
                state["early_stopped"] = state["finished"] = True
        state["train_seconds"] += time.perf_counter() - self.epoch_start
        state["last_val"] = self.val
        row = self._epoch_row(epoch, loss_sum, cost, peak_mb)
        state["history"].append(row)
        state.update(epoch=epoch + 1, batch=0, finished=state["finished"] or epoch + 1 == engine.epochs)
        self.running.zero_()
        self.averaging.keep(epoch + 1, self.module)
        self.save_checkpoint()
        self.on_epoch_end(row)
        if not engine.eval_every_steps:
            self.log(row)
        return state["finished"]

    def _epoch_row(self, epoch: int, loss_sum: torch.Tensor, cost: dict, peak_mb: float) -> dict:
        state, model = self.state, self.module.model
        return {
            "epoch": epoch + 1,
            "step": state["step"],
            "lr": self.scheduler.get_last_lr()[0],
            "train_loss": float(loss_sum) / max(state["batch"], 1),
            **{f"val_{k}": v for k, v in self.task.scalar_metrics(self.val).items()},
            "lambda": self.module.objective.threshold,
            "best_step": state["best"].get(self.select[0], {}).get("step"),
            **cost,
            "peak_memory_mb": peak_mb,
            "elapsed_s": state["train_seconds"],
            **self.plan.epoch_summary(),
            **(self.monitor.pop_epoch() if self.monitor is not None else {}),
            **(model.pop_epoch_diagnostics() if hasattr(model, "pop_epoch_diagnostics") else {}),
        }

    def finish(self) -> dict:
        """The reported states (best or last) scored, and the averaged weights when kept."""
        state, select = self.state, self.select
        if select[0] not in state["best"]:  # validation every N steps never came round
            self.record_validation(self.evaluate("val"), state["epoch"])
        if self.engine.report_state == "last":
            final = {
                "epoch": state["epoch"],
                "step": state["step"],
                "val": state.get("last_val") or self.evaluate("val"),
                "state": self.snapshot(),
            }
            state["best"] = {metric: {**final, "value": final["val"][metric]} for metric in select}
        result = self.engine._score_selected(self.module, state, select, self.evaluate, self.device, self.channels_last)
        if self.averaging.enabled:
            result["averaged"] = self.averaging.score(
                self.module, self.evaluate, self.engine.final_splits, next(iter(state["best"].values()))["state"]
            )
        return result
