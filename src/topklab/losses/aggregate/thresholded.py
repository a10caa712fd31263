from __future__ import annotations

import math

import torch

from topklab.losses.aggregate.base import Aggregate, AggregateInputError, check_k, resolve_count
from topklab.losses.aggregate.kernels import KERNELS, native_built, native_extension, native_ready, thresholded
from topklab.losses.aggregate.lambda_monitor import WARN_AFTER_CALLS, LambdaMonitor
from topklab.losses.aggregate.lambda_rules import HoldsRule, LambdaRule, rule_for, split_tie_mass
from topklab.losses.aggregate.solve import kth_largest
from topklab.losses.aggregate.triton_pass import attach_scratch
from topklab.losses.aggregate.triton_pass import available as triton_available
from topklab.losses.aggregate.triton_pass import row_call as triton_row_call
from topklab.losses.threshold import get_constraint
from topklab.smoothing import get_smoothing
from topklab.utils.checks import check_int

MAX_DELTA = 1e12  # SReLU's root √(x² + δ²) is |x| from 2^63 on in float32: δ²/x² must be below rounding there
MIN_DELTA = 1e-15  # r(r − z) >= δ² stays a normal float32 (the C++ pass divides by it); below, SReLU is ReLU anyway

SCALES = ("paper", "atk")
NATIVE_DTYPES = (torch.float32, torch.float64)
GPU_COMPILE_MIN_N = 16384  # compile_min_n=None: the shortest row kernel="auto" compiles on a GPU (no Triton launch)


_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def _transformed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is wrapped by a ``torch.func`` transform (grad, vmap …); never while compiling."""
    return not torch.compiler.is_compiling() and _wrapped(tensor)


def check_delta(delta: float | None, smoothing: str) -> float | None:
    """δ as a float (None where the smoothing has none), or a one-line ValueError."""
    if delta is not None and not (isinstance(delta, (int, float)) and not isinstance(delta, bool) and delta > 0):
        raise ValueError(f"delta={delta!r} must be a positive number (the paper uses 0.01)")
    if delta is not None and not delta <= MAX_DELTA:
        raise ValueError(
            f"delta={delta!r} is too large: SReLU is computed without overflow for δ up to {MAX_DELTA:.0e} "
            f"(the paper uses 0.01)"
        )
    if delta is not None and delta < MIN_DELTA:
        raise ValueError(
            f"delta={delta!r} is too small: SReLU's slope is computed without underflow for δ from "
            f"{MIN_DELTA:.0e} (below it SReLU is ReLU at float32's resolution; use MATk for ReLU; the paper uses 0.01)"
        )
    if smoothing == "srelu" and delta is None:
        raise ValueError("smoothing='srelu' needs its width delta > 0 (the paper uses 0.01)")
    return None if delta is None else float(delta)


def check_lam_init(lam_init: float | str) -> float | str:
    if lam_init != "auto" and (
        isinstance(lam_init, bool) or not isinstance(lam_init, (int, float)) or not math.isfinite(lam_init)
    ):
        raise ValueError(
            f"lam_init={lam_init!r} must be a finite number or 'auto' (the first training batch's k-th largest loss)"
        )
    return lam_init


class ThresholdedTopK(HoldsRule, Aggregate):
    """``(1/n)·Σ φ(ℓ_i − λ) + (k/n)·λ`` with a threshold λ; the common form of MATk (φ = ReLU) and
    STk (φ smooth). Use :class:`MATk` or :class:`STk`.

    ``scale="paper"`` returns the equation as printed (factor k/n relative to ATk at the optimum);
    ``scale="atk"`` multiplies by n/k so that the minimum over λ equals ATk (Fan et al.'s MATk form).

    **λ** follows the losses by a rule (:mod:`~topklab.losses.aggregate.lambda_rules`: ``lam_update``
    names one, or pass a :class:`~topklab.losses.aggregate.lambda_rules.LambdaRule`), which owns its
    storage, the λ of training and evaluation calls, its optimizer group and checks. Losses ``(..., n)``
    reduced over ``dim`` are P rows: a stored λ (set by the rule) is each row's own on a training call
    (their mean is stored) and the stored one outside training; a trained λ is shared by the rows.
    ``rows=R`` keeps a λ per row for exactly R rows. Every training call records whether λ is in band
    (:mod:`~topklab.losses.aggregate.lambda_monitor`, each row judged) in ``self.monitor``; after 100
    consecutive out-of-band calls the module warns once.

    Value and gradients come from the fused kernels of :mod:`topklab.losses.aggregate.kernels`:
    ``kernel="auto"`` runs the C++ one on a CPU (prebuilt with the package). On CUDA, wherever Triton
    imports, a started training call under a rule that sets λ (not a trained λ) on one row or up to
    1,024 contiguous rows runs as Triton launches at every n
    (:func:`~topklab.losses.aggregate.triton_pass.row_call`, which lists the calls it leaves out);
    every other call on a GPU takes the ``torch.compile``-d kernel. Either device uses its fused
    kernel for rows of at least ``compile_min_n`` losses (None: every row on a CPU, from 16,384 on a
    GPU) and the eager one below. ``"native"``, ``"compiled"`` and ``"eager"`` force one;
    ``"triton"`` takes the launch wherever Triton runs, and ``auto``'s path for the calls it leaves
    out. A module call on 1-D float32/float64 CPU losses on the C++ path is one C++
    call (:meth:`_one_row`), which costs about what ``losses.mean()`` does. Under ``torch.func``
    transforms the formula runs on torch operations (the fused node has no functorch rule).

    Extreme losses (``tests/losses/test_aggregate_probe.py``): no finite loss overflows; a +inf loss
    makes the value +inf; a −inf loss contributes φ's limit and no gradient; λ stays finite; NaN
    propagates, and a NaN row's λ does not enter the stored values.
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
        lam_update: str | LambdaRule | None = None,
        lam_lr: float | None = None,
        solve_steps: int | None = None,
        lam_momentum: float | None = None,
        dim: int = -1,
        rows: int | None = None,
    ):
        super().__init__(dim)
        self._k = check_k(k)
        check_int("rows", rows, allow_none=True, why="the number of rows the module keeps a λ for, one each")
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; choose one of: {', '.join(KERNELS)}")
        why = "rows at least this long use the native or compiled kernel under kernel=auto (null: the default)"
        check_int("compile_min_n", compile_min_n, allow_none=True, why=why)
        if scale not in SCALES:
            raise ValueError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
        if kernel == "triton" and not triton_available():
            raise ValueError("kernel='triton' needs the triton package (pip install triton); use kernel='auto'")
        self.rows, self.kernel, self.compile_min_n, self.scale = rows, kernel, compile_min_n, scale
        self._required = kernel not in ("auto", "triton")  # a forced path raises where it cannot run
        self.smoothing, self._phi = smoothing, get_smoothing(smoothing)
        self.delta = check_delta(delta, smoothing)
        self.lam_init = check_lam_init(lam_init)
        self._constraint = get_constraint(lam_constraint)
        given = {"solve_steps": solve_steps, "lam_momentum": lam_momentum, "lam_lr": lam_lr}
        self.rule = rule_for(lam_update, **{name: value for name, value in given.items() if value is not None})
        self._started = False  # host copy of the buffer lam_started
        self.rule.attach(self, () if rows is None else (rows,), 0.0 if lam_init == "auto" else float(lam_init))
        self.monitor = LambdaMonitor()
        self._on_device_pass = attach_scratch(self)  # whether triton_pass.row_call may apply
        self._row_settings: dict = {}  # the one-row lane's plan per row length and settings (_row_plan)

    @property
    def k(self) -> int | float | torch.Tensor:
        return self._k

    @k.setter
    def k(self, k: int | float | torch.Tensor) -> None:
        self._k = check_k(k)
        self._row_settings.clear()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if prefix + "lam_started" not in state_dict:  # saved before λ's start was a buffer: a saved λ was started
            state_dict[prefix + "lam_started"] = torch.tensor(True)
        if hasattr(self, "lam_width") and prefix + "lam_width" not in state_dict:  # saved without a window: the
            state_dict[prefix + "lam_width"] = torch.zeros_like(self.lam_width)  # next call widens it to the spacing
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._started = bool(self.lam_started)

    def __getstate__(self):
        state = dict(super().__getstate__())
        state["_row_settings"] = {}  # the lane's plans hold C++ objects: rebuilt on the next call
        return state

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.monitor.move(fn)
        self._row_settings.clear()  # the buffers' dtype decides the lane
        return self

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        """The aggregate of ``losses`` (..., n) over ``dim``, one value per row; on a training call
        the rule sets or starts λ first, and the monitor records the call (see the class)."""
        device_pass = self._on_device_pass and (losses.is_cuda or self.kernel == "triton")
        one_row = triton_row_call(self, losses) if device_pass else None
        one_row = self._one_row(losses) if one_row is None else one_row
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
        if not (self.training and torch.is_grad_enabled()):
            return self.from_rows(self.batched(rows, k, self.rule.eval_lam(self, rows), delta), losses)
        if _transformed(rows) or _transformed(self.lam):
            raise AggregateInputError(
                f"{type(self).__name__}'s training call sets λ and its monitor in place, which torch.func transforms "
                f"forbid; call the module in eval() mode (λ as stored) inside the transform, or outside it"
            )
        detached = rows.detach()
        lam, share, at_kth = self.rule.training_lam(self, detached, k, count, delta)
        value = self.batched(rows, k, lam, delta, at_kth=at_kth)
        self._record(detached, lam.detach(), k, count, share, at_kth and self.smoothing == "relu")
        return self.from_rows(value, losses)

    def _one_row(self, losses: torch.Tensor) -> torch.Tensor | None:
        """The call on 1-D float32/float64 CPU losses on the native path as one C++ call
        (``thresholded_cpu.cpp``'s ``row_call`` with the plan's ``RowCall``: λ's rule, the
        monitor's sums and the fused value and gradients), or None where the general path runs: other
        inputs, a first training call, a tensor k, ``rows``, ``torch.func`` transforms. It equals the
        general path bit for bit (value, gradients, λ, the monitor's sums) for a solved λ or one at a
        given λ, except the monitor's smoothed share under a trained λ (the kernel's own sum of the
        gradients); a tracked call sums in blocks, within about one rounding of the general path."""
        if (
            torch.compiler.is_compiling()  # the lane is eager-only; its settings cache would guard on n
            or type(losses) is not torch.Tensor
            or losses.dim() != 1
            or not losses.is_cpu
            or losses.dtype not in NATIVE_DTYPES
            or _wrapped(losses)
            or (not self.rule.stored and _wrapped(self.lam))
        ):
            return None
        n = losses.shape[0]
        plan = self._row_plan(n, losses.dtype)
        if plan is None:
            return None
        training = self.training and torch.is_grad_enabled()
        count, calls = plan
        monitor = self.monitor
        if training and (calls[0] is None or not self._started or monitor._state is None):
            return None
        if not native_built() and not native_ready(losses, "using the eager kernel instead", self._required):
            return None
        call = self._row_call(n, losses.dtype, count, calls, 0 if training else 1)
        sample = training and monitor.native_call(count, n)
        buffers = self._buffers  # read directly: nn.Module's attribute lookup costs about a microsecond a call
        lam = buffers["lam"] if self.rule.stored else self.threshold
        grads = torch.is_grad_enabled() and (losses.requires_grad or lam.requires_grad)
        state = monitor._state if training else None
        lam_last = buffers.get("lam_last")
        value = native_extension().row_call(
            losses, lam, lam_last, buffers.get("lam_width"), state, call, monitor.burn_in, grads, sample
        )
        if training and monitor.calls % WARN_AFTER_CALLS == 0:
            shown = lam if lam_last is None else lam_last  # the λ this call set (tracked: the next call's)
            monitor.check_streak(
                lambda: self._row_shares(losses.detach()[None], shown.detach().to(losses.dtype).view(1))[0], count, n
            )
        return value

    def _row_plan(self, n: int, dtype: torch.dtype) -> tuple | None:
        """(k's count, [how a training call runs ("tracked", "solved", "at_lambda" or None: not in the
        lane), "at_lambda" for other calls]) for one row of n losses in ``dtype`` on the native path, or
        None where the one-row lane does not apply (another path, a tensor k, ``rows``, no δ for SReLU).
        A stored λ is set in the lane only in float32 buffers. Cached per n and dtype (the list then
        holds the C++ ``RowCall`` objects built for it); changing k or moving the module clears the cache."""
        key = (n, dtype, self.scale, self.kernel, self.compile_min_n, self.rows, self.delta)
        if key not in self._row_settings:
            native = self._chosen_path(n, "cpu") == "native"
            lane = native and n > 0 and self.rows is None and not isinstance(self.k, torch.Tensor)
            if not lane or (self.delta is None and self._phi.uses_delta):
                self._row_settings[key] = None
            else:
                lams = (b for name, b in self._buffers.items() if name.startswith("lam") and b.is_floating_point())
                float32 = all(b.dtype == torch.float32 for b in lams)
                entry = self.rule.lane(self, n) if float32 or not self.rule.stored else None
                self._row_settings[key] = (resolve_count(self.k, n), [entry, "at_lambda"])
        return self._row_settings[key]

    def _row_call(self, n: int, dtype: torch.dtype, count: int, calls: list, which: int):
        """The C++ ``RowCall`` of ``calls[which]`` (the plan's list), built on first use and kept there:
        the scale n/k in the losses' dtype, as the general path's ``n / k`` rounds it."""
        call = calls[which]
        if isinstance(call, str):
            extension = native_extension()
            entry, call = call, extension.RowCall()
            call.entry, call.smoothing, call.k = getattr(extension, entry.upper()), self._phi.native_id, count
            call.delta = 0.0 if self.delta is None else self.delta
            call.scale = float(n / torch.full((1,), count, dtype=dtype)) if self.scale == "atk" else 1.0
            call.momentum, call.steps = self.rule.lam_momentum, self.rule.steps_at(n)
            calls[which] = call
        return call

    def _record(self, losses, lam, k, count, share, at_kth: bool = False) -> None:
        """One training call in the monitor: rows ``losses`` (P, n) at their λ (P,). One row: the
        smoothed share against k/n; several: the call is in band only where every row is. At λ = ℓ_[k]
        (``at_kth``) the share is the gradient's, the tied losses' mass included: min(#{ℓ >= λ}, k)/n."""
        if at_kth:
            shares = torch.minimum((losses >= lam[:, None]).sum(1).to(k.dtype), k) / losses.shape[1]
            share = shares.mean()
        elif share is None or losses.shape[0] > 1:
            shares = self._row_shares(losses, lam)
            share = shares.mean() if share is None else share
        else:
            shares = None
        total = count * losses.shape[0] if count is not None else int(k.sum())
        rows_ok = None if shares is None else self.monitor.rows_in_band(shares, k / losses.shape[1])
        self.monitor.record(share, total, losses.numel(), self._sampler(losses, lam, k, count), rows_ok)

    def _row_shares(self, losses: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """Each row's smoothed share above its λ (P,): the mean of φ'(ℓ − λ)."""
        delta = losses.new_tensor(self.delta if self.delta is not None else 0.0)
        return self._phi.slope(losses - lam[:, None], delta, losses.new_ones(())).mean(1)

    def _sampler(self, losses: torch.Tensor, lam: torch.Tensor, k: torch.Tensor | None, count: int | None):
        """The monitor's sample of a call: (the hard share of losses > λ, λ − ℓ_[k]), computed when called."""

        def sample():
            kth = kth_largest(losses, k if count is None else count)
            return (losses > lam[:, None]).double().mean(), (lam - kth).double().mean()

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
        """λ's optimizer group where the rule trains it (no weight decay; under ``lam_lr`` its own rate
        with ``constant_lr``, which the engine leaves out of the schedule), else empty."""
        return self.rule.parameter_groups(self)

    def batched(self, losses, k, lam, delta, at_kth: bool = False):
        """Per row p: ``(1/n)·Σ_i φ_δp(ℓ_pi − λ_p) + (k_p/n)·λ_p`` (times n/k_p under ``scale="atk"``),
        through the fused kernel (:func:`~topklab.losses.aggregate.kernels.thresholded`). ``at_kth``:
        λ_p is each row's ℓ_[k] exactly (MATk's solve), where the tied losses get (k/n)·ATk's gradient
        (:func:`~topklab.losses.aggregate.lambda_rules.split_tie_mass`)."""
        n = losses.shape[1]
        scale = n / k if self.scale == "atk" else torch.ones_like(k)
        if delta is None:
            if self._phi.uses_delta:
                raise ValueError(f"smoothing={self.smoothing!r} needs a width delta > 0 for every row; got None")
            delta = torch.zeros_like(k)
        if _transformed(losses) or _transformed(lam):  # the formula, which torch.func differentiates
            value = (self._phi.row_mean(losses - lam[:, None], delta[:, None]) + k / n * lam) * scale
        else:
            value = thresholded(losses, lam, delta, k, scale, self._phi, self.path_for(losses), self._required)
        if at_kth and self.smoothing == "relu" and losses.requires_grad and torch.is_grad_enabled():
            with torch.no_grad():
                dtype = value.dtype
                mass = split_tie_mass(losses.detach().to(dtype), lam.to(dtype), k.to(dtype), (scale / n).to(dtype))
            zero = (losses.to(dtype) - losses.detach().to(dtype)) * mass  # 0, with the mass as its gradient
            value = value + torch.where(mass != 0, zero, torch.zeros_like(zero)).sum(1)
        return value

    def path_for(self, losses: torch.Tensor) -> str:
        """The kernel path for a (P, n) block: ``kernel`` unless it is ``auto``, which takes the fast
        kernel ("native": the C++ one on a CPU, which :func:`thresholded` turns into the compiled one
        on a GPU) for rows of at least ``compile_min_n`` losses and the eager kernel for shorter rows
        (``compile_min_n=None``: every row on a CPU, rows of at least :data:`GPU_COMPILE_MIN_N` on a
        GPU). Inside a user's ``torch.compile`` always eager. On CUDA under ``auto`` a training call
        that the Triton launch takes (:meth:`forward`) never reaches this choice."""
        if torch.compiler.is_compiling() or _transformed(losses):
            return "eager"
        return self._chosen_path(losses.shape[1], losses.device.type)

    def _chosen_path(self, n: int, device_type: str) -> str:
        """:meth:`path_for` outside a user's torch.compile."""
        if self._required:
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
        return f", lam_update={self.lam_update!r}, {self.rule.settings_repr(self)}"

    def _rows_repr(self) -> str:
        return "" if self.rows is None else f", rows={self.rows}"

    def _kernel_repr(self) -> str:
        shown = self.kernel == "auto" and self.compile_min_n is not None
        return f", kernel={self.kernel!r}" + (f", compile_min_n={self.compile_min_n}" if shown else "")
