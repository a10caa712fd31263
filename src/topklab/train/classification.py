"""The training loop of every image-classification run (``trainer=vision``).

Per epoch: train with the configured loader, validate, keep the best-validation state per
selection metric, write a summary row (metrics and cost figures) and a checkpoint. A restarted run
with the same config continues from its last checkpoint and, on CPU, ends with exactly the
metrics of an uninterrupted run: all randomness of an epoch derives from (seed, epoch) and every
piece of state (model, optimizer, scheduler, scaler, λ, RNG, running sums, best states, logger
id) is in the checkpoint. Test metrics come from the best-validation state.
"""
from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from tqdm import tqdm

from topklab.data.vision.loaders import LOADERS, build_loader
from topklab.train.checkpoint import CheckpointStore
from topklab.train.classification_metrics import classification_metrics
from topklab.train.profiling import StepProfile, peak_memory_bytes
from topklab.train.schedules import LRFactor
from topklab.train.tabular import lambda_of
from topklab.utils.errors import NonFiniteLossError, TopklabError
from topklab.utils.seed import rng_state, set_rng_state

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TopklabError(f"trainer.device={name} but no CUDA device is visible; use trainer.device=cpu or auto")
    return torch.device(name)


class ClassificationTrainer:
    """Mini-batch training of an image classifier on ``aggregate(individual(model(x), y))``.

    Parameters
    ----------
    epochs : int >= 1
    batch_size : int >= 1; eval_batch_size : int >= 1
    loader : device | torchvision
        device: the uint8 set lives on the device and is augmented there (fast path);
        torchvision: a DataLoader with per-image transforms (``num_workers`` processes).
    pad : int >= 0, zero padding of the random crop (0: no crop); flip : bool, random horizontal flip
    device : auto | cpu | cuda[:i]
    amp : none | bf16 | fp16, autocast dtype (fp16 adds a GradScaler); the loss runs in float32
    channels_last : auto | true | false (auto: on CUDA only)
    schedule : dict, :class:`~topklab.train.schedules.LRFactor` fields (name cosine | step | constant,
        warmup_epochs, milestones, gamma, min_lr_ratio); stepped every batch
    select_metrics : list of top1 | top5, validation metrics whose best epoch gives reported test numbers
    many_shot, few_shot : group thresholds (more than 100 / fewer than 20 training images)
    checkpoint_every : int >= 0, also checkpoint every this many steps (0: at epoch ends only)
    resume : bool, continue from the run key's checkpoint when one exists
    max_steps : int or None, stop after this many steps (smoke runs, profiling)
    profiler : dict(enabled, wait, warmup, active), torch.profiler over the first steps; the
        Chrome trace goes to ``<run dir>/profile/trace.json``
    progress : bool, a tqdm bar per epoch
    """

    def __init__(self, epochs: int = 200, batch_size: int = 128, eval_batch_size: int = 512, loader: str = "device",
                 num_workers: int = 0, pad: int = 4, flip: bool = True, drop_last: bool = False, device: str = "auto",
                 amp: str = "none", channels_last="auto", schedule: dict | None = None, select_metrics=("top1",),
                 many_shot: int = 100, few_shot: int = 20, checkpoint_every: int = 0, resume: bool = True,
                 max_steps: int | None = None, profiler: dict | None = None, progress: bool = True):
        for name, value in (("epochs", epochs), ("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"trainer.{name}={value!r} must be an int >= 1")
        if loader not in LOADERS:
            raise ValueError(f"trainer.loader={loader!r}; choose one of {', '.join(LOADERS)}")
        if amp not in AMP_DTYPES:
            raise ValueError(f"trainer.amp={amp!r}; choose one of {', '.join(AMP_DTYPES)}")
        if channels_last not in ("auto", True, False):
            raise ValueError(f"trainer.channels_last={channels_last!r}; choose auto, true or false")
        bad = [m for m in select_metrics if m not in ("top1", "top5")]
        if bad or not select_metrics:
            raise ValueError(f"trainer.select_metrics={list(select_metrics)}; use a non-empty list of top1, top5")
        if checkpoint_every < 0 or (max_steps is not None and max_steps < 1):
            raise ValueError("trainer.checkpoint_every must be >= 0 and trainer.max_steps >= 1 or null")
        self.epochs, self.batch_size, self.eval_batch_size = epochs, batch_size, eval_batch_size
        self.loader, self.num_workers, self.pad, self.flip, self.drop_last = loader, num_workers, pad, flip, drop_last
        self.device_name, self.amp, self.channels_last = device, amp, channels_last
        self.schedule = dict(schedule or {"name": "constant"})
        LRFactor(steps_per_epoch=1, epochs=epochs, **self.schedule)  # validates the fields now
        self.select_metrics = list(select_metrics)
        self.many_shot, self.few_shot = many_shot, few_shot
        self.checkpoint_every, self.resume, self.max_steps = checkpoint_every, resume, max_steps
        self.profiler = {"enabled": False, "wait": 1, "warmup": 1, "active": 3, **(profiler or {})}
        self.progress = progress

    # ----------------------------------------------------------------------------------------------
    def fit(self, model: nn.Module, individual: nn.Module, aggregate: nn.Module, optimizer: torch.optim.Optimizer,
            splits, generator: torch.Generator, on_epoch_end: Callable[[dict], None] = lambda row: None,
            on_eval: Callable[[dict], None] = lambda row: None, workdir: str | Path | None = None,
            run_dir: str | Path | None = None, logger_id: str | None = None) -> dict:
        device = resolve_device(self.device_name)
        channels_last = device.type == "cuda" if self.channels_last == "auto" else bool(self.channels_last)
        amp_dtype = AMP_DTYPES[self.amp]
        seed = generator.initial_seed()
        model.to(device, memory_format=torch.channels_last if channels_last else torch.preserve_format)
        individual.to(device)
        aggregate.to(device)
        loader_args = dict(pad=self.pad, flip=self.flip, channels_last=channels_last, num_workers=self.num_workers)
        train_loader = build_loader(self.loader, splits.x_train, splits.y_train, self.batch_size, splits.mean, splits.std,
                                    True, device, drop_last=self.drop_last, seed=seed, **loader_args)
        steps_per_epoch = len(train_loader)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, LRFactor(steps_per_epoch=steps_per_epoch,
                                                                          epochs=self.epochs, **self.schedule))
        scaler = torch.amp.GradScaler(device.type, enabled=self.amp == "fp16")
        counts = splits.class_counts
        group_counts = splits.shot_counts  # many / medium / few by the long-tailed set's sizes, before hold-out

        def autocast():
            if amp_dtype is None:
                return contextlib.nullcontext()
            return torch.autocast(device.type, dtype=amp_dtype)

        def eval_loader(images, labels):
            return build_loader(self.loader, images, labels, self.eval_batch_size, splits.mean, splits.std, False,
                                device, drop_last=False, seed=seed, **loader_args)

        val_loader = eval_loader(splits.x_val, splits.y_val)

        def evaluate(loader, labels) -> dict:
            model.eval()
            with torch.no_grad(), autocast():
                logits = torch.cat([model(x).float() for x, _ in loader.batches()])
            model.train()
            return classification_metrics(logits, labels, group_counts, many=self.many_shot, few=self.few_shot)

        def snapshot() -> dict:
            return {"model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                    "loss": copy.deepcopy(aggregate.state_dict())}

        store = CheckpointStore(workdir) if workdir is not None else None
        state = {"epoch": 0, "batch": 0, "step": 0, "loss_sum": 0.0, "history": [], "best": {},
                 "train_seconds": 0.0, "logger_id": logger_id, "finished": False}
        if store is not None and self.resume and store.exists():
            saved = store.load()
            model.load_state_dict(saved["model"])
            aggregate.load_state_dict(saved["loss"])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            scaler.load_state_dict(saved["scaler"])
            set_rng_state(saved["rng"])
            state = saved["progress"]
            state["logger_id"] = logger_id or state.get("logger_id")
            for row in state["history"]:
                on_epoch_end(row)

        check_each_step = device.type != "cuda"  # on a GPU a per-step check would synchronise every step
        running = torch.tensor(state["loss_sum"], dtype=torch.float64, device=device)

        def check_finite(where: str) -> None:
            if not torch.isfinite(running):
                raise NonFiniteLossError(
                    f"non-finite loss {where}; lower optim.lr or set trainer.amp=none "
                    f"(resume from the last finite checkpoint with trainer.resume=true)",
                    last_good_state=snapshot())

        def save_checkpoint() -> None:
            if store is None:
                return
            check_finite(f"before the checkpoint at step {state['step']}")
            state["loss_sum"] = float(running)
            store.save({"model": model.state_dict(), "loss": aggregate.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng_state(),
                        "progress": state},
                       {"epoch": state["epoch"], "batch": state["batch"], "step": state["step"],
                        "logger_id": state["logger_id"], "finished": state["finished"]})

        profile = StepProfile(device)
        profiler = self._torch_profiler(run_dir)
        model.train()
        with profiler:
            for epoch in range(state["epoch"], self.epochs if not state["finished"] else state["epoch"]):
                profile.reset()
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                epoch_start = time.perf_counter()
                bar = tqdm(total=steps_per_epoch, initial=state["batch"], desc=f"epoch {epoch + 1}/{self.epochs}",
                           disable=not self.progress, leave=False)
                fetch_start = time.perf_counter()
                for x, y in train_loader.batches(epoch, start=state["batch"]):
                    waited = time.perf_counter() - fetch_start
                    compute_start = profile.now()
                    with autocast():
                        output = model(x)
                    loss_start = profile.now()
                    objective = aggregate(individual(output.float(), y))
                    loss_end = profile.now()
                    if check_each_step and not torch.isfinite(objective):
                        raise NonFiniteLossError(
                            f"non-finite loss ({float(objective.detach())}) at epoch {epoch + 1}, step {state['step'] + 1}; "
                            f"lower optim.lr or set trainer.amp=none (the last checkpoint is kept)",
                            last_good_state=snapshot())
                    optimizer.zero_grad(set_to_none=True)
                    scaler.scale(objective).backward()
                    scaler.step(optimizer)
                    scaler.update()
                    scheduler.step()
                    profile.step(waited, loss_start, loss_end, compute_start, profile.now(), len(y))
                    profiler.step()
                    state["step"] += 1
                    state["batch"] += 1
                    running += objective.detach().double()
                    bar.update(1)
                    if self.checkpoint_every and state["step"] % self.checkpoint_every == 0:
                        state["train_seconds"] += time.perf_counter() - epoch_start
                        epoch_start = time.perf_counter()
                        save_checkpoint()
                    if self.max_steps is not None and state["step"] >= self.max_steps:
                        state["finished"] = True
                        break
                    fetch_start = time.perf_counter()
                bar.close()
                cost = profile.summary()
                peak_mb = peak_memory_bytes(device) / 2**20
                check_finite(f"in epoch {epoch + 1}")
                val = evaluate(val_loader, splits.y_val)
                for metric in self.select_metrics:
                    best = state["best"].get(metric)
                    if best is None or val[metric] > best["value"]:
                        state["best"][metric] = {"value": val[metric], "epoch": epoch + 1, "step": state["step"],
                                                 "val": val, "state": snapshot()}
                state["train_seconds"] += time.perf_counter() - epoch_start
                row = {"epoch": epoch + 1, "step": state["step"], "lr": scheduler.get_last_lr()[0],
                       "train_loss": float(running) / max(state["batch"], 1),
                       **{f"val_{k}": val[k] for k in ("top1", "top5", "many", "medium", "few") if k in val},
                       "lambda": lambda_of(aggregate), **cost,
                       "peak_memory_mb": peak_mb, "elapsed_s": state["train_seconds"]}
                state["history"].append(row)
                state.update(epoch=epoch + 1, batch=0, finished=state["finished"] or epoch + 1 == self.epochs)
                running.zero_()
                save_checkpoint()
                on_epoch_end(row)
                on_eval(row)
                if state["finished"]:
                    break

        results, tested = {}, {}
        test_loader = eval_loader(splits.x_test, splits.y_test)
        for metric in self.select_metrics:
            best = state["best"][metric]
            if best["epoch"] not in tested:  # metrics selecting the same epoch share one test pass
                model.load_state_dict(best["state"]["model"])
                aggregate.load_state_dict(best["state"]["loss"])
                tested[best["epoch"]] = evaluate(test_loader, splits.y_test)
            results[metric] = {"epoch": best["epoch"], "step": best["step"], "val": best["val"],
                               "test": tested[best["epoch"]]}
        primary_best = state["best"][self.select_metrics[0]]["state"]
        model.load_state_dict(primary_best["model"])
        aggregate.load_state_dict(primary_best["loss"])
        primary = results[self.select_metrics[0]]
        last = state["history"][-1]
        return {
            "metrics": {"val": primary["val"], "test": primary["test"]},
            "selection": {m: {"epoch": r["epoch"], "step": r["step"], "val": r["val"][m], "test": r["test"][m]}
                          for m, r in results.items()},
            "best_step": primary["step"], "best_epoch": primary["epoch"], "steps": state["step"],
            "epochs": state["epoch"], "lambda": lambda_of(aggregate), "train_seconds": state["train_seconds"],
            "class_counts": counts, "device": str(device), "amp": self.amp, "channels_last": channels_last,
            "loader": self.loader,
            "cost": {k: last[k] for k in ("step_time_s", "images_per_s", "data_wait_share", "loss_share", "peak_memory_mb")},
        }

    def _torch_profiler(self, run_dir):
        settings = self.profiler
        if not settings["enabled"]:
            return _NoProfiler()
        if run_dir is None:
            raise TopklabError("trainer.profiler.enabled needs a run directory for the trace")
        trace = Path(run_dir) / "profile" / "trace.json"
        trace.parent.mkdir(parents=True, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return torch.profiler.profile(
            activities=activities, record_shapes=True, profile_memory=True,
            schedule=torch.profiler.schedule(wait=settings["wait"], warmup=settings["warmup"], active=settings["active"], repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace)),
        )


class _NoProfiler(contextlib.nullcontext):
    def step(self) -> None:
        pass
