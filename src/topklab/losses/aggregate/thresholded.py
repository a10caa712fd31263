from __future__ import annotations

import math

import torch
from torch import nn

from topklab.losses.aggregate.base import Aggregate, AggregateInputError, check_k, resolve_count
from topklab.losses.aggregate.kernels import KERNELS, native_built, native_extension, native_ready, thresholded
from topklab.losses.aggregate.lambda_monitor import WARN_AFTER_CALLS, LambdaMonitor
from topklab.losses.aggregate.solve import (
    kth_largest,
    relu_threshold_step,
    relu_window,
    solve_srelu_threshold,
    srelu_threshold_step,
)
from topklab.losses.threshold import get_constraint
from topklab.smoothing import get_smoothing
from topklab.utils.checks import check_int
from topklab.utils.k import resolve_k

MAX_DELTA = 1e12  # SReLU's root √(x² + δ²) is |x| from 2^63 on in float32: δ²/x² must be below rounding there
MIN_DELTA = 1e-15  # r(r − z) >= δ² stays a normal float32 (the C++ pass divides by it); below, SReLU is ReLU anyway

SCALES = ("paper", "atk")
LAM_UPDATES = ("track", "solve", "gradient")
SOLVABLE = ("srelu", "relu")  # smoothings whose stationarity equation lam_update="solve" can solve
TRACKABLE = ("srelu", "relu")  # smoothings whose λ lam_update="track" steps (SReLU: a solve step; ReLU: a window's)
NATIVE_DTYPES = (torch.float32, torch.float64)
GPU_COMPILE_MIN_N = 16384  # compile_min_n=None: the shortest row kernel="auto" compiles on a GPU


class ThresholdedTopK(Aggregate):
    """``(1/n)·Σ φ(ℓ_i − λ) + (k/n)·λ`` with a trainable threshold λ; the common form of MATk
    (φ = ReLU) and STk (φ smooth). Use :class:`MATk` or :class:`STk`.

    ``scale="paper"`` returns the equation as printed (factor k/n relative to ATk at the optimum);
    ``scale="atk"`` multiplies by n/k so that the minimum over λ equals ATk (Fan et al.'s MATk form).

    Value and gradients come from the fused kernels of :mod:`topklab.losses.aggregate.kernels`:
    ``kernel="auto"`` runs the C++ one on a CPU (prebuilt with the package) and the
    ``torch.compile``-d one on a GPU for rows of at least ``compile_min_n`` losses, the eager one
    below that; by default (``compile_min_n=None``) the C++ one at every n on a CPU and the compiled
    one from 16,384 losses on a GPU. ``"native"``, ``"compiled"`` and ``"eager"`` force one (see
    :meth:`path_for`). A module call on 1-D float32/float64 CPU losses on the C++ path is one C++
    call (:meth:`_one_row`), which costs about what ``losses.mean()`` does.

    How λ follows the losses (``lam_update``):

    - ``"track"`` (the default of :class:`STk` and :class:`MATk`): a training call uses the λ the
      previous call stepped to, and the one pass over the losses that gives the value and the
      gradient also gives what the next step needs: for SReLU the sums of one safeguarded solve step
      (:func:`~topklab.losses.aggregate.solve.srelu_threshold_step`, the steps of ``"solve"`` taken
      one per call), for MATk the counts within a window around λ (:func:`~topklab.losses.
      aggregate.solve.relu_threshold_step`). λ is one call behind the batch's root and the loss
      costs one pass, about what ``losses.mean()`` with its backward does.
      The first training call solves as ``"solve"`` does (``solve_steps`` steps from ``lam_init``).
      λ is a buffer, and a running average of the stepped values is the λ used outside training.
      Being one call behind, it leaves the band where the losses move by a large share of their
      spread from one call to the next (uniform losses that fall by a quarter of their width per
      call: in band on 1 call of 5, ``tests/losses/test_solve_native.py``), where ``"solve"``
      follows them; training moves its losses far less per step (the falling distribution of
      ``tests/losses/test_lambda_tracking.py``: in band as "solve" is).
    - ``"solve"``: on each training call (``self.training`` with gradients enabled) λ is
      the root of the batch's stationarity equation in λ, found by ``solve_steps`` safeguarded
      steps warm-started from the last root (:func:`~topklab.losses.aggregate.solve.
      solve_srelu_threshold`; for MATk the exact k-th largest loss, a selection). λ is then a
      buffer, not a parameter: the loss's gradient in the losses is exact at the root (envelope
      theorem) and nothing of λ goes to the optimizer. A running average of the roots (momentum
      ``lam_momentum``, as BatchNorm's statistics) is the λ used outside training.
    - ``"gradient"``: λ is an ``nn.Parameter`` trained by the optimizer with the model, the paper's
      SGD-STk (papers.md §1.5). With ``lam_lr`` the engine gives it its own parameter group at that
      learning rate (no weight decay, no schedule); ``lam_lr=None`` keeps the model's rate and
      schedule. Under Adam λ then moves about one learning rate per step, which cannot follow
      losses that fall by units per epoch (λ below every loss is the Average objective).

    λ for batched rows (losses ``(..., n)`` reduced over ``dim``, P rows):

    - ``"solve"``: every row gets its own root on a training call, at no extra cost (the solve is
      batched over rows), all warm-started from the one stored λ; the stored warm start and running
      average follow the mean of the rows' finite roots (``"track"``: every row uses the stored λ and
      steps from it, and the next stored λ is the mean of the rows' finite steps), and a call outside training uses that one
      running average for every row (as BatchNorm's statistics). Rows whose roots lie far apart may
      need more ``solve_steps`` to reach them from the shared start (MATk's selection needs none).
    - ``"gradient"``: one λ, shared by every row (its gradient collects every row's), for any
      number of rows; each row's value is then its Eq. 5/6 at that λ, at or above the row's own
      minimum over λ, and ``lam_init="auto"`` starts λ at the k-th largest of all the rows' losses
      together at the sum of their counts.
    - ``rows=R`` builds the module for exactly R rows: λ (and under "solve" the warm start and the
      running average) has one entry per row, each started, solved and averaged on its own row,
      and losses with another number of rows are an :class:`~topklab.losses.aggregate.base.
      AggregateInputError`.

    Every training call records whether λ is in band (:mod:`~topklab.losses.aggregate.
    lambda_monitor`) in ``self.monitor`` (for several rows, over all their losses and counts
    together); after 100 consecutive out-of-band calls the module warns once.

    Extreme losses (``tests/losses/test_aggregate_probe.py`` checks each against an exact reference): no finite
    loss overflows (SReLU's root is |x| where x² would overflow, and the mean of φ is summed in float64
    with each term divided by n first); a +inf loss makes the value +inf and counts 1 above every λ; a
    −inf loss contributes φ's limit (SReLU: −δ/2, ReLU: 0) and no gradient; λ stays finite (the solve
    brackets the finite losses, MATk's k-th largest is clamped to their range). NaN propagates, and a
    NaN row's root does not enter λ's stored values (an all-NaN batch leaves them as they were).
    """

    hyperparameters = ("k",)
    has_threshold = True

    def __init__(
        self,
        k: int | float | torch.Tensor,
        smoothing: str,
        delta: float | None = 0.01,
        lam_init: float | str = "auto",
        lam_constraint: str = "none",
        scale: str = "paper",
        kernel: str = "auto",
        compile_min_n: int | None = None,
        lam_update: str = "solve",
        lam_lr: float | None = None,
        solve_steps: int = 2,
        lam_momentum: float = 0.1,
        dim: int = -1,
        rows: int | None = None,
    ):
        super().__init__(dim)
        self.k = check_k(k)
        check_int("rows", rows, allow_none=True, why="the number of rows the module keeps a λ for, one each")
        self.rows = rows
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; choose one of: {', '.join(KERNELS)}")
        check_int(
            "compile_min_n",
            compile_min_n,
            allow_none=True,
            why="rows at least this long use the native or compiled kernel under kernel=auto (null: the default)",
        )
        if delta is not None and not (isinstance(delta, (int, float)) and not isinstance(delta, bool) and delta > 0):
            raise ValueError(f"delta={delta!r} must be a positive number (the paper uses 0.01)")
        if delta is not None and not delta <= MAX_DELTA:
            raise ValueError(
                f"delta={delta!r} is too large: SReLU is computed without overflow for δ up to "
                f"{MAX_DELTA:.0e} (the paper uses 0.01)"
            )
        if delta is not None and delta < MIN_DELTA:
            raise ValueError(
                f"delta={delta!r} is too small: SReLU's slope is computed without underflow for δ from "
                f"{MIN_DELTA:.0e} (below it SReLU is ReLU at float32's resolution; use MATk for ReLU; the paper uses 0.01)"
            )
        if scale not in SCALES:
            raise ValueError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
        if smoothing == "srelu" and delta is None:
            raise ValueError("smoothing='srelu' needs its width delta > 0 (the paper uses 0.01)")
        self.smoothing = smoothing
        self._phi = get_smoothing(smoothing)
        self.delta = None if delta is None else float(delta)
        self.scale = scale
        self.kernel = kernel
        self.compile_min_n = compile_min_n
        self._constraint = get_constraint(lam_constraint)
        self._check_update(lam_update, lam_lr, solve_steps, lam_momentum, lam_init)
        self.lam_update, self.lam_lr, self.solve_steps, self.lam_momentum = (
            lam_update,
            lam_lr,
            solve_steps,
            float(lam_momentum),
        )
        self.lam_init = lam_init
        start = 0.0 if lam_init == "auto" else float(lam_init)
        shape = () if rows is None else (rows,)
        if lam_update == "gradient":
            self.lam = nn.Parameter(torch.full(shape, float(self.lam_of(start))))
        else:
            self.register_buffer("lam", torch.full(shape, start))  # the running average: λ outside training
            self.register_buffer("lam_last", torch.full(shape, start))  # the last training call's root: the warm start
            if lam_update == "track" and smoothing == "relu":
                self.register_buffer("lam_width", torch.zeros(shape))  # MATk's tracking window (relu_threshold_step)
        self._started = False  # whether λ has been started (lam_init="auto") and, under "solve", solved once
        self.monitor = LambdaMonitor()
        self._row_settings: dict = {}  # the one-row lane's constants per row length and settings (_row_constants)

    def _check_update(self, lam_update, lam_lr, solve_steps, lam_momentum, lam_init) -> None:
        if lam_update not in LAM_UPDATES:
            raise ValueError(f"unknown lam_update {lam_update!r}; choose one of: {', '.join(LAM_UPDATES)}")
        if lam_init != "auto" and (
            isinstance(lam_init, bool) or not isinstance(lam_init, (int, float)) or not math.isfinite(lam_init)
        ):
            raise ValueError(
                f"lam_init={lam_init!r} must be a finite number or 'auto' (the first training batch's "
                f"k-th largest loss)"
            )
        if lam_lr is not None and (
            isinstance(lam_lr, bool)
            or not isinstance(lam_lr, (int, float))
            or not lam_lr > 0
            or not math.isfinite(lam_lr)
        ):
            raise ValueError(f"lam_lr={lam_lr!r} must be a positive number, or null for the model's learning rate")
        check_int("solve_steps", solve_steps, why="solve steps per training call")
        if isinstance(lam_momentum, bool) or not isinstance(lam_momentum, (int, float)) or not 0 < lam_momentum <= 1:
            raise ValueError(
                f"lam_momentum={lam_momentum!r} must lie in (0, 1] (the running average's weight of "
                f"the newest root, as BatchNorm's momentum)"
            )
        if lam_update != "gradient":
            able = SOLVABLE if lam_update == "solve" else TRACKABLE
            if self.smoothing not in able:
                raise ValueError(
                    f"lam_update={lam_update!r} needs smoothing in {', '.join(able)}, got {self.smoothing!r}; "
                    f"use lam_update='gradient' for the Table 2 ablation's smoothings"
                )
            if self._constraint.name != "none":
                raise ValueError(
                    f"lam_constraint={self._constraint.name!r} applies to lam_update='gradient'; "
                    f"with lam_update={lam_update!r} λ is the root itself (set lam_constraint=none)"
                )
            if lam_lr is not None:
                raise ValueError(
                    f"lam_lr applies to lam_update='gradient'; with lam_update={lam_update!r} λ is not trained "
                    "(set lam_lr=null)"
                )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if hasattr(self, "lam_width") and prefix + "lam_width" not in state_dict and prefix + "lam_last" in state_dict:
            # saved before MATk tracked: a zero window, which the next call widens to the losses' mean spacing
            state_dict[prefix + "lam_width"] = torch.zeros_like(self.lam_width)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._started = True  # a loaded λ is a started one: no re-initialisation from the next batch

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        """The aggregate of ``losses`` (..., n) over ``dim``, one value per row; on a training call
        λ is solved (per row) or started first, and the monitor records the call (see the class)."""
        one_row = self._one_row(losses)
        if one_row is not None:
            return one_row
        rows = self.as_rows(losses)
        if self.rows is not None and rows.shape[0] != self.rows:
            raise AggregateInputError(
                f"{type(self).__name__} was built with rows={self.rows} (a λ per row), but losses of shape "
                f"{tuple(losses.shape)} reduced over dim={self.dim} have {rows.shape[0]} rows; pass "
                f"{self.rows} rows, or build it with rows=None for one λ shared by any number of rows"
            )
        k, count = self.counts(rows, self._batch(losses))
        delta = None if self.delta is None else rows.new_full(rows.shape[:1], self.delta)
        training = self.training and torch.is_grad_enabled()
        detached = rows.detach()
        share = None
        if self.lam_update != "gradient":
            if training and self.lam_update == "track" and self._started:
                lam, share = self._track(detached, k, delta)
            elif training:
                lam, share = self._solve(detached, k, count, delta)
            else:
                lam = self.lam.to(rows.dtype).expand(rows.shape[0])
        else:
            if training and not self._started:
                self._start_gradient(detached, k, count)
            lam = self.threshold.to(rows.dtype).expand(rows.shape[0])
        value = self.batched(rows, k, lam, delta)
        if training:
            self._record(detached, lam.detach(), k, count, share)
        return self.from_rows(value, losses)

    def _one_row(self, losses: torch.Tensor) -> torch.Tensor | None:
        """The call on 1-D float32/float64 CPU losses on the native path as one C++ call
        (``thresholded_cpu.cpp``'s ``solve_call``/``row_call``: λ's solve and stored values, the
        monitor's sums and the fused value and gradients), or None where the general path below runs:
        other inputs, the first training call (which starts λ and the monitor), a tensor k, ``rows``.
        It equals the general path bit for bit (value, gradients, λ,
        the monitor's sums), except the monitor's smoothed share under ``lam_update="gradient"``, which
        is the kernel's own sum of the gradients (the same to rounding)."""
        if (
            torch.compiler.is_compiling()  # the lane is eager-only; its settings cache would guard on n
            or type(losses) is not torch.Tensor
            or losses.dim() != 1
            or not losses.is_cpu
            or losses.dtype not in NATIVE_DTYPES
        ):
            return None
        n = losses.shape[0]
        constants = self._row_constants(n, losses.dtype)
        if constants is None:
            return None
        training = self.training and torch.is_grad_enabled()
        update = self.lam_update
        monitor = self.monitor
        if training and (
            not self._started or monitor._state is None or (update != "gradient" and not self._solve_in_lane())
        ):
            return None
        if not native_built() and not native_ready(losses, "using the eager kernel instead", self.kernel != "auto"):
            return None
        count, scale, delta = constants
        sample = training and monitor.native_call(count, n)
        buffers = self._buffers
        if training and update == "track":
            value = native_extension().track_call(
                losses,
                buffers["lam"],
                buffers["lam_last"],
                buffers.get("lam_width"),
                monitor._state,
                self._phi.native_id,
                count,
                delta,
                scale,
                self.lam_momentum,
                monitor.burn_in,
                losses.requires_grad,
                sample,
            )
            lam = buffers["lam_last"]  # the next call's λ: the warning's share is read there
        elif training and update == "solve":
            value, lam = native_extension().solve_call(
                losses,
                buffers["lam"],
                buffers["lam_last"],
                monitor._state,
                count,
                delta,
                scale,
                self._phi.native_id,
                self.lam_momentum,
                self.solve_steps,
                monitor.burn_in,
                losses.requires_grad,
                sample,
            )
        else:
            lam = buffers["lam"] if update != "gradient" else self.threshold
            grads = torch.is_grad_enabled() and (losses.requires_grad or lam.requires_grad)
            value = native_extension().row_call(
                losses,
                lam,
                delta,
                count,
                scale,
                self._phi.native_id,
                grads,
                monitor._state if training else None,
                monitor.burn_in,
                sample,
            )
        if training and monitor.calls % WARN_AFTER_CALLS == 0:
            monitor.check_streak(
                lambda: self._share(losses.detach()[None], lam.detach().to(losses.dtype).view(1)), count, n
            )
        return value

    def _solve_in_lane(self) -> bool:
        """Whether the lane solves or steps λ here: SReLU's or MATk's, in float32 buffers."""
        return self.smoothing in SOLVABLE and all(buffer.dtype == torch.float32 for buffer in self._buffers.values())

    def _row_constants(self, n: int, dtype: torch.dtype) -> tuple[int, float, float] | None:
        """(k's count, the output scale, δ) for one row of n losses in ``dtype`` on the native path
        (the scale n/k in the losses' dtype, as the general path's ``n / k`` rounds it), or None
        where the one-row lane does not apply (another path, a tensor k, ``rows``, no δ for SReLU)."""
        key = (n, dtype, self.k, self.scale, self.kernel, self.compile_min_n, self.rows, self.delta)
        if key not in self._row_settings:
            native = self._chosen_path(n, "cpu") == "native"
            lane = native and n > 0 and self.rows is None and not isinstance(self.k, torch.Tensor)
            if not lane or (self.delta is None and self._phi.uses_delta):
                self._row_settings[key] = None
            else:
                count = resolve_count(self.k, n)
                scale = float(n / torch.full((1,), count, dtype=dtype)) if self.scale == "atk" else 1.0
                self._row_settings[key] = (count, scale, 0.0 if self.delta is None else self.delta)
        return self._row_settings[key]

    def solve_rows(
        self, losses: torch.Tensor, k: torch.Tensor, delta: torch.Tensor | None, start: torch.Tensor
    ) -> torch.Tensor:
        """Each row's root (P,) of ``losses`` (P, n) at counts ``k`` (P,): SReLU's by ``solve_steps``
        safeguarded steps warm-started from ``start``, ReLU's the row's k-th largest loss (a sort).

        Examples
        --------
        >>> MATk(k=2).solve_rows(torch.tensor([[1.0, 5.0, 3.0, 0.0], [4.0, 3.0, 2.0, 1.0]]),
        ...                      torch.tensor([2.0, 1.0]), None, torch.zeros(2))
        tensor([3., 4.])
        """
        if self.smoothing == "relu":
            descending = losses.sort(dim=1, descending=True).values
            return descending.gather(1, (k.long() - 1).view(-1, 1)).view(-1)
        lam, _ = solve_srelu_threshold(
            losses, k, delta, start, self.solve_steps, self.path_for(losses), self.kernel != "auto"
        )
        return lam

    def _kth(self, losses: torch.Tensor, k: torch.Tensor, count: int | None) -> torch.Tensor:
        """Each row's k-th largest loss (P,), clamped to its finite range: by selection where the rows
        share the count ``count``, by a sort where each row has its own (a tensor k)."""
        return kth_largest(losses, k if count is None else count)

    def _solve(self, losses: torch.Tensor, k: torch.Tensor, count: int | None, delta: torch.Tensor | None):
        """Each row's root λ (P,) and the smoothed share above them (None where not known yet);
        updates the warm start and the running average: each row's own under ``rows``, else the
        mean of the rows' finite roots."""
        if self.smoothing == "relu":
            lam, share = self._kth(losses, k, count), None
            if self.lam_update == "track":
                self._store_width(relu_window(losses))
        else:
            if not self._started and self.lam_init == "auto":
                kth = self._kth(losses, k, count)
                self.lam_last.copy_(kth if self.rows is not None else kth.mean())
            start = self.lam_last.expand(losses.shape[0])
            lam, smoothed = solve_srelu_threshold(
                losses, k, delta, start, self.solve_steps, self.path_for(losses), self.kernel != "auto"
            )
            share = smoothed.sum() / losses.numel()
        self._store(lam)
        return lam, share

    def _track(self, losses: torch.Tensor, k: torch.Tensor, delta: torch.Tensor):
        """``lam_update="track"``: the λ (P,) this call uses, the stored warm start (each row's under
        ``rows``), and the smoothed share above it; stores each row's one solve step from there
        (:func:`~topklab.losses.aggregate.solve.srelu_threshold_step`) as :meth:`_solve` stores roots."""
        lam = self.lam_last.to(losses.dtype, copy=True).expand(losses.shape[0])  # a copy: _store overwrites the buffer
        if self.smoothing == "relu":
            width = self.lam_width.to(losses.dtype).expand(losses.shape[0])
            stepped, width, count = relu_threshold_step(losses, k, lam, width)
            self._store_width(width)
        else:
            stepped, count = srelu_threshold_step(losses, k, delta, lam)
        self._store(stepped)
        return lam, count.sum() / losses.numel()

    def _store_width(self, width: torch.Tensor) -> None:
        """MATk's tracking window from the rows' new windows (P,): each row's under ``rows``, else
        the mean of the finite ones (a row with a NaN loss keeps the stored one)."""
        with torch.no_grad():
            width = width.to(self.lam_width.dtype)  # a window beyond float32's range is not stored
            finite = torch.isfinite(width)
            if self.rows is None:
                found = finite.sum()
                width = torch.where(finite, width, torch.zeros_like(width)).sum() / found.clamp(min=1)
                finite = found > 0
            self.lam_width.copy_(torch.where(finite, width, self.lam_width))

    def _store(self, lam: torch.Tensor) -> None:
        """The warm start and the running average from the rows' new λ (P,): each row's own under
        ``rows``, else the mean of the rows' finite values."""
        with torch.no_grad():  # a non-finite root leaves its stored λ as it was (the engine stops on its loss)
            finite = torch.isfinite(lam)
            if self.rows is not None:
                root, valid = lam.to(self.lam.dtype), finite
            else:
                found = finite.sum()
                root = (torch.where(finite, lam, torch.zeros_like(lam)).sum() / found.clamp(min=1)).to(self.lam.dtype)
                valid = found > 0
            self.lam_last.copy_(torch.where(valid, root, self.lam_last))
            average = (1.0 - self.lam_momentum) * self.lam + self.lam_momentum * root if self._started else root
            self.lam.copy_(torch.where(valid, average, self.lam))
        self._started = True

    def _start_gradient(self, losses: torch.Tensor, k: torch.Tensor, count: int | None) -> None:
        """``lam_init="auto"`` under the gradient update: λ starts at this first batch's k-th largest
        loss: each row's under ``rows``, else that of all the rows' losses together at the sum of
        their counts (the root of a λ shared by the rows)."""
        if self.lam_init == "auto":
            with torch.no_grad():
                if self.rows is None:
                    total = count * losses.shape[0] if count is not None else int(k.sum())
                    parts = [(losses.reshape(-1), total, losses.shape[0] == 1)]
                else:
                    parts = [(row, int(c), True) for row, c in zip(losses, k.tolist())]
                if self.lam_constraint == "none":  # λ is stored as it is: no value read on the host (compile-friendly)
                    starts = torch.stack([self._auto_start(*part) for part in parts])
                    self.lam.copy_(starts.to(self.lam.dtype).view(self.lam.shape))
                else:
                    starts = [self.lam_of(float(self._auto_start(*part))) for part in parts]
                    self.lam.copy_(torch.tensor(starts, dtype=self.lam.dtype).view(self.lam.shape))
        self._started = True

    def _auto_start(self, losses: torch.Tensor, total: int, one_row: bool) -> torch.Tensor:
        """The k-th largest of 1-D ``losses`` at the count ``total``; under torch.distributed, of the
        whole batch over the ranks, so that every replica starts alike and as one process would (the
        module's k resolved for the whole batch where ``losses`` is one row, else ``total`` scaled)."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            local, losses = losses.numel(), _every_rank(losses)
            if one_row and not isinstance(self.k, torch.Tensor):
                total = resolve_k(self.k, losses.numel())
            else:
                total = min(losses.numel(), max(1, round(total * losses.numel() / local)))
        return kth_largest(losses, total)

    def _record(
        self, losses: torch.Tensor, lam: torch.Tensor, k: torch.Tensor, count: int | None, share: torch.Tensor | None
    ) -> None:
        """One training call in the monitor: the rows' losses (P, n) and their λ (P,) together, the
        smoothed share over all P·n losses against the summed count over P·n."""
        if share is None:
            share = self._share(losses, lam)
        total = count * losses.shape[0] if count is not None else int(k.sum())
        self.monitor.record(share, total, losses.numel(), self._sampler(losses, lam, k, count))

    def _share(self, losses: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """The smoothed share above λ of rows ``losses`` (P, n) at their λ (P,): the mean of φ'(ℓ − λ)."""
        delta = losses.new_tensor(self.delta if self.delta is not None else 0.0)
        return self._phi.slope(losses - lam[:, None], delta, losses.new_ones(())).mean()

    def _sampler(self, losses: torch.Tensor, lam: torch.Tensor, k: torch.Tensor | None, count: int | None):
        """The monitor's sample of a call: (the hard share of losses > λ, λ − ℓ_[k]), computed when called."""

        def sample():
            return (losses > lam[:, None]).double().mean(), (lam - self._kth(losses, k, count)).double().mean()

        return sample

    @property
    def lam_constraint(self) -> str:
        return self._constraint.name

    @property
    def threshold(self) -> torch.Tensor:
        """The effective λ (after the constraint), which approaches the k-th largest loss."""
        return self.threshold_of(self.lam)

    def threshold_of(self, lam: torch.Tensor) -> torch.Tensor:
        """The effective λ of stored values ``lam`` (any shape; e.g. one per population member)."""
        return self._constraint.value(lam)

    def lam_of(self, threshold: float) -> float:
        """The stored value whose effective λ is ``threshold`` (the inverse of :meth:`threshold_of`)."""
        return self._constraint.raw_from_value(float(threshold))

    def parameter_groups(self) -> list[dict]:
        """λ's optimizer group: no weight decay, and under ``lam_lr`` its own rate with ``constant_lr``
        (the engine leaves such a group out of the schedule); empty unless ``lam_update="gradient"``."""
        if self.lam_update != "gradient":
            return []
        group = {"params": [self.lam], "weight_decay": 0.0}
        if self.lam_lr is not None:
            group.update(lr=float(self.lam_lr), constant_lr=True)
        return [group]

    def batched(self, losses, k, lam, delta):
        """Per row p: ``(1/n)·Σ_i φ_δp(ℓ_pi − λ_p) + (k_p/n)·λ_p`` (times n/k_p under ``scale="atk"``),
        through the fused kernel (:func:`~topklab.losses.aggregate.kernels.thresholded`)."""
        n = losses.shape[1]
        scale = n / k if self.scale == "atk" else torch.ones_like(k)
        if delta is None:
            if self._phi.uses_delta:
                raise ValueError(f"smoothing={self.smoothing!r} needs a width delta > 0 for every row; got None")
            delta = torch.zeros_like(k)
        return thresholded(
            losses, lam, delta, k, scale, self._phi, self.path_for(losses), required=self.kernel != "auto"
        )

    def path_for(self, losses: torch.Tensor) -> str:
        """The kernel path for a (P, n) block: ``kernel`` unless it is ``auto``, which takes the fast
        kernel ("native": the C++ one on a CPU, which :func:`thresholded` turns into the compiled one
        on a GPU) for rows of at least ``compile_min_n`` losses and the eager kernel for shorter rows
        (``compile_min_n=None``: every row on a CPU, rows of at least :data:`GPU_COMPILE_MIN_N` on a
        GPU). Inside a user's ``torch.compile`` always eager."""
        return self._path_for_length(losses.shape[1], losses.device.type)

    def _path_for_length(self, n: int, device_type: str) -> str:
        return "eager" if torch.compiler.is_compiling() else self._chosen_path(n, device_type)

    def _chosen_path(self, n: int, device_type: str) -> str:
        """:meth:`path_for` outside a user's torch.compile."""
        if self.kernel != "auto":
            return self.kernel
        shortest = self.compile_min_n
        if shortest is None:
            shortest = 1 if device_type == "cpu" else GPU_COMPILE_MIN_N
        return "eager" if n < shortest else "native"

    def extra_repr(self) -> str:
        return (
            f"k={self.k}, smoothing={self.smoothing!r}, delta={self.delta}, "
            f"lam_constraint={self.lam_constraint!r}, scale={self.scale!r}{self._kernel_repr()}{self._update_repr()}"
            f"{self._dim_repr()}{self._rows_repr()}"
        )

    def _update_repr(self) -> str:
        if self.lam_update != "gradient":
            steps = "" if self.smoothing == "relu" else f", solve_steps={self.solve_steps}"
            return f", lam_update={self.lam_update!r}{steps}, lam_momentum={self.lam_momentum}"
        return f", lam_update='gradient', lam_lr={self.lam_lr}, lam_init={self.lam_init!r}"

    def _rows_repr(self) -> str:
        return "" if self.rows is None else f", rows={self.rows}"

    def _kernel_repr(self) -> str:
        shown = self.kernel == "auto" and self.compile_min_n is not None
        return f", kernel={self.kernel!r}" + (f", compile_min_n={self.compile_min_n}" if shown else "")


def _every_rank(losses: torch.Tensor) -> torch.Tensor:
    """The 1-D losses of every rank, concatenated in rank order (ranks may hold different counts)."""
    world = torch.distributed.get_world_size()
    counts = [torch.zeros((), dtype=torch.long, device=losses.device) for _ in range(world)]
    torch.distributed.all_gather(counts, torch.tensor(losses.numel(), device=losses.device))
    longest = int(max(counts))
    padded = torch.cat([losses, losses.new_zeros(longest - losses.numel())])
    parts = [torch.empty_like(padded) for _ in range(world)]
    torch.distributed.all_gather(parts, padded)
    return torch.cat([part[: int(count)] for part, count in zip(parts, counts)])


class MATk(ThresholdedTopK):
    """Minimised average-top-k loss, STk paper Eq. 5 (Ogryczak & Tamir 2003):

    ``L_mat-k(λ) = (1/n)·Σ [ℓ_i − λ]_+ + (k/n)·λ``

    minimised over the model and λ. ``min_λ L_mat-k = (k/n)·ATk``: the default scale is the
    paper's k/n, **not** ATk's 1/k. By default (``lam_update="track"``) each training call uses the
    λ that the previous call stepped to, and its one pass over the losses counts those within a
    window around λ, from which λ steps towards this batch's k-th largest loss
    (:func:`~topklab.losses.aggregate.solve.relu_threshold_step`): one pass per call, λ one call
    behind. ``lam_update="solve"`` takes each batch's exact k-th largest loss (a selection), where
    MATk is exactly (k/n)·ATk; ``lam_update="gradient"`` trains λ with the model instead (put
    ``loss.parameters()`` in the optimizer).

    Parameters
    ----------
    k : int >= 1, float in (0, 1] or Tensor
        A count, or a fraction of the batch (rounded half-up, at least 1). A tensor gives each row
        its own k: integer counts in [1, n] or floating fractions in (0, 1], of a shape that
        broadcasts to the losses' shape without ``dim`` (each row's λ is then solved at its own k).
    lam_update : {"track", "solve", "gradient"}
        How λ follows the losses (see :class:`ThresholdedTopK`): "track" (default), a step per
        call towards the batch's k-th largest loss from the last call's λ; "solve", the exact k-th
        largest loss of each training batch; both with a running average outside training;
        "gradient", a parameter trained by the optimizer (the paper's SGD-STk).
    lam_lr : float > 0 or None
        "gradient" only: λ's own learning rate in the engine (its own parameter group, no schedule);
        None = the model's rate and schedule (the paper's setting).
    lam_init : float or "auto"
        Initial λ (not given by the paper): "auto" = the first training batch's k-th largest loss.
        Under "solve" only the first warm start.
    lam_momentum : float in (0, 1]
        "solve" only: the running average's weight of each new root (BatchNorm's momentum).
    lam_constraint : {"none", "clamp", "softplus"}
        "gradient" only: how λ >= 0 is kept (not given by the paper); see :mod:`topklab.losses.threshold`.
    scale : {"paper", "atk"}
        ``paper`` = Eq. 5 as printed; ``atk`` multiplies by n/k.
    kernel : {"auto", "native", "compiled", "eager"}
        ``auto`` = on rows of >= ``compile_min_n`` losses the C++ kernel on a CPU (prebuilt with
        the package) and the ``torch.compile``-d one on a GPU, falling back where they cannot be
        built; below that the eager kernel, whose gradients are autograd's of the formula bit for
        bit. All agree to float32 rounding.
    compile_min_n : int >= 1 or None
        The shortest row that ``auto`` sends to the native or compiled kernel. None (default):
        every row on a CPU, rows of at least 16,384 losses on a GPU. The experiment configs set
        16384, the path their committed results ran.
    dim : int
        The axis of the losses to aggregate (default -1, the last); the other axes are rows, with
        λ as :class:`ThresholdedTopK` describes (per row under "solve", shared under "gradient").
    rows : int >= 1 or None
        None (default): one stored λ for any number of rows. R: the module takes exactly R rows and
        keeps a λ per row (a parameter of shape (R,) under "gradient"; buffers under "solve").

    Examples
    --------
    >>> loss = MATk(k=2)
    >>> losses = torch.tensor([1.0, 5.0, 3.0, 0.0], requires_grad=True)
    >>> loss(losses), loss.threshold  # a training call solves λ = ℓ_[2] = 3: (2/4)·ATk = 2
    (tensor(2., grad_fn=<ViewBackward0>), tensor(3.))
    >>> losses = torch.tensor([[1.0, 5.0, 3.0, 0.0], [1.0, 5.0, 3.0, 0.0]])
    >>> loss.batched(losses, k=torch.tensor([2.0, 1.0]), lam=torch.tensor([3.0, 5.0]), delta=None)  # row by row
    tensor([2.0000, 1.2500])
    >>> loss(torch.tensor([[1.0, 5.0, 3.0, 0.0], [4.0, 4.0, 0.0, 0.0]]))  # rows: each its own λ, 3 and 4
    tensor([2., 2.])
    >>> per_row = MATk(k=2, lam_update="gradient", rows=2)  # a trained λ per row
    >>> per_row(torch.tensor([[1.0, 5.0, 3.0, 0.0], [4.0, 4.0, 0.0, 0.0]])), per_row.threshold.tolist()
    (tensor([2., 2.], grad_fn=<ViewBackward0>), [3.0, 4.0])
    """

    def __init__(
        self,
        k: int | float | torch.Tensor,
        lam_init: float | str = "auto",
        lam_constraint: str = "none",
        scale: str = "paper",
        kernel: str = "auto",
        compile_min_n: int | None = None,
        lam_update: str = "track",
        lam_lr: float | None = None,
        lam_momentum: float = 0.1,
        dim: int = -1,
        rows: int | None = None,
    ):
        super().__init__(
            k,
            smoothing="relu",
            delta=None,
            lam_init=lam_init,
            lam_constraint=lam_constraint,
            scale=scale,
            kernel=kernel,
            compile_min_n=compile_min_n,
            lam_update=lam_update,
            lam_lr=lam_lr,
            lam_momentum=lam_momentum,
            dim=dim,
            rows=rows,
        )

    def extra_repr(self) -> str:
        return (
            f"k={self.k}, lam_constraint={self.lam_constraint!r}, scale={self.scale!r}{self._kernel_repr()}"
            f"{self._update_repr()}{self._dim_repr()}{self._rows_repr()}"
        )


class STk(ThresholdedTopK):
    """Smoothed top-k loss, STk paper Eq. 6 (Xia, Liu & Mao, NeurIPS 2024):

    ``L_st-k(λ) = (1/n)·Σ SReLU_δ(ℓ_i − λ) + (k/n)·λ``,  SReLU (Eq. 2) = ½(x + √(x²+δ²) − δ)

    Sort-free and O(n). ``L_mat-k − δ/2 <= L_st-k <= L_mat-k`` for every λ, and L_st-k → L_mat-k
    as δ → 0. The default scale is the paper's k/n, **not** ATk's 1/k. By default
    (``lam_update="track"``) each training call uses the λ that the previous call stepped to and,
    in the same pass over the losses, takes one safeguarded step towards this batch's root of
    ``Σ SReLU'(ℓ_i − λ) = k``, so that the loss costs one pass and λ follows the losses one call
    behind; ``lam_update="solve"`` puts λ at each batch's own root by ``solve_steps`` steps
    (a few passes more); ``lam_update="gradient"`` is the paper's SGD-STk, λ a parameter trained
    with the model.

    Parameters
    ----------
    k : int >= 1, float in (0, 1] or Tensor
        A count, or a fraction of the batch (rounded half-up, at least 1); a tensor, one k per row
        (as in :class:`MATk`).
    delta : float in [1e-15, 1e12]
        SReLU smoothing width; smaller is closer to MATk. Paper default 0.01. Ignored by the
        other smoothings.
    smoothing : {"srelu", "elu", "softplus", "leaky_relu"}
        φ in place of ReLU; the others are the Table 2 ablation at PyTorch defaults.
    lam_update : {"track", "solve", "gradient"}
        How λ follows the losses (see :class:`ThresholdedTopK`); "track" and "solve" need smoothing
        "srelu". Default "track".
    solve_steps : int >= 1
        "solve" (and "track"'s first training call): safeguarded steps per training call (Newton's, or a power-law step outside
        a pile of losses; :func:`~topklab.losses.aggregate.solve.power_law_step`) (no early exit, so no
        synchronisation); more steps come closer to the batch's own root. Default 2.
    lam_lr, lam_init, lam_momentum, lam_constraint, scale, kernel, compile_min_n, dim, rows
        As in :class:`MATk` (under "track", ``lam_lr`` and ``lam_constraint`` as under "solve").

    Examples
    --------
    >>> loss = STk(k=0.5, delta=0.01, solve_steps=20)
    >>> losses = torch.tensor([1.0, 5.0, 3.0, 0.0], requires_grad=True)
    >>> value = loss(losses)  # a training call: every λ between ℓ_[3] = 1 and ℓ_[2] = 3 (δ/2 in) is a root
    >>> round(value.item(), 4), 1 < loss.threshold.item() < 3  # MATk's minimum is 2; STk's lies within δ/2 below
    (1.995, True)
    >>> loss.eval()(losses.detach()).item() == value.item()  # outside training: the running average of the roots
    True
    >>> per_member = loss.batched(torch.tensor([[1.0, 5.0, 3.0, 0.0]] * 2), torch.tensor([2.0, 2.0]),
    ...                           torch.tensor([3.0, 3.0]), delta=torch.tensor([0.01, 1.0]))
    >>> [round(v, 4) for v in per_member.tolist()]  # a wider δ lies further below MATk
    [1.9963, 1.7043]
    """

    hyperparameters = ("k", "delta")

    def __init__(
        self,
        k: int | float | torch.Tensor,
        delta: float = 0.01,
        smoothing: str = "srelu",
        lam_init: float | str = "auto",
        lam_constraint: str = "none",
        scale: str = "paper",
        kernel: str = "auto",
        compile_min_n: int | None = None,
        lam_update: str = "track",
        lam_lr: float | None = None,
        solve_steps: int = 2,
        lam_momentum: float = 0.1,
        dim: int = -1,
        rows: int | None = None,
    ):
        super().__init__(
            k,
            smoothing=smoothing,
            delta=delta,
            lam_init=lam_init,
            lam_constraint=lam_constraint,
            scale=scale,
            kernel=kernel,
            compile_min_n=compile_min_n,
            lam_update=lam_update,
            lam_lr=lam_lr,
            solve_steps=solve_steps,
            lam_momentum=lam_momentum,
            dim=dim,
            rows=rows,
        )
