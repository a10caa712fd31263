"""The tracked training call of MATk and STk on one row of losses as one Triton launch, registered as
a torch op (``torch.ops.topklab.tracked_row``), for CUDA (and Triton's interpreter on a CPU,
``TRITON_INTERPRET=1``, where it is tested).

One launch: every program streams its blocks of losses once at the stored λ, writes the gradient
``(s/n)·φ'(ℓ − λ)`` and its partial sums (the value's Σφ, the next step's sums, the finite range);
the last program to finish (an atomic ticket, reset by it) combines the partials in program order
(deterministic: no float atomics) in float64 and writes the value, the next λ (STk: one safeguarded
solve step, ``solve.srelu_threshold_step``; MATk: a step within its window,
``solve.relu_threshold_step``), the running average and the λ monitor's sums, all on the device.
The backward is one launch that scales the saved gradient by the incoming one into a new tensor
(the saved one stays, for another backward), read on the device: no host synchronisation anywhere.
Losses in float32, bfloat16 or float16 are summed in float32 per block and float64 across programs.
"""

from __future__ import annotations

import math
from functools import cache

import torch

from topklab.losses.aggregate.base import resolve_count
from topklab.losses.aggregate.lambda_monitor import WARN_AFTER_CALLS

BLOCK = 1024  # losses per block
MOST_PROGRAMS = 1024  # programs per launch (the last one combines their partials in one load)
SLOTS = 8  # partial sums per program: φ, count, second, third, least, most, +inf count, unused
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ON_CHIP = 4096  # the longest row a solved call holds in one program
ROW_LAMS = MOST_PROGRAMS * (SLOTS + 1)  # where the work's rows' λ start (after the partials and the rows' shares)
SOLVE_SLOTS = 8  # a long solved row's state between its launches (triton_kernels.solve_pass_kernel)
BINS = 2**16  # MATk's histogram of 16 bits of the losses' keys (triton_kernels.select_pass_kernel)


def available() -> bool:
    """Whether Triton imports here (a CUDA device, or its interpreter on a CPU)."""
    try:
        import triton  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


@cache
def kernels():
    """The kernels (:mod:`~topklab.losses.aggregate.triton_kernels`) by name, imported on first use."""
    from topklab.losses.aggregate.triton_kernels import (  # noqa: PLC0415
        relu_value_kernel,
        scale_kernel,
        select_pass_kernel,
        solve_pass_kernel,
        solved_row_kernel,
        threshold_gradient_kernel,
        tracked_row_kernel,
    )

    return {
        "tracked_row": tracked_row_kernel,
        "scale": scale_kernel,
        "solved_row": solved_row_kernel,
        "solve_pass": solve_pass_kernel,
        "select_pass": select_pass_kernel,
        "relu_value": relu_value_kernel,
        "threshold_gradient": threshold_gradient_kernel,
    }


def launch_shape(n: int, rows: int = 1) -> tuple[int, int]:
    """(programs a row, blocks per program) for ``rows`` rows of n losses (at most :data:`MOST_PROGRAMS`
    programs in all)."""
    blocks = max(1, math.ceil(n / BLOCK))
    programs = min(blocks, MOST_PROGRAMS // rows)
    return programs, math.ceil(blocks / programs)


def tracked_row_launch(
    losses: torch.Tensor,
    lam: torch.Tensor,
    lam_last: torch.Tensor,
    lam_width: torch.Tensor,
    state: torch.Tensor,
    work: torch.Tensor,
    ticket: torch.Tensor,
    k: int,
    delta: float,
    scale: float,
    momentum: float,
    burn_in: float,
    relu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One tracked training call on ``losses`` (n,), or contiguous rows (P, n) each with its own λ:
    (value (0-d, or (P,)), ∂value/∂losses). Updated in place: the float32 buffers ``lam`` (running
    average), ``lam_last`` (the λ used, then the next one) and ``lam_width`` (MATk's window; STk
    passes any float32 scalar), one entry a row, the monitor's float64 ``state``, and the scratch
    ``work`` (float32, ``MOST_PROGRAMS × (SLOTS + 2)``) and int32 ``ticket`` (``MOST_PROGRAMS`` + 1,
    zero between calls), which the module keeps (:func:`attach_scratch`). Registered as the op
    ``torch.ops.topklab.tracked_row`` (:data:`tracked_row`), which ``torch.compile`` sees."""
    n, rows = losses.shape[-1], losses.numel() // max(losses.shape[-1], 1)
    programs, iters = launch_shape(n, rows)
    grad = torch.empty_like(losses)
    value = losses.new_empty(losses.shape[:-1])
    kernel = kernels()["tracked_row"]
    kernel[(programs, rows)](
        losses, grad, value, lam, lam_last, lam_width, state, work, ticket,
        n, k, delta, scale, momentum, burn_in, iters,
        RELU=relu, BLOCK=BLOCK, PROGRAMS=MOST_PROGRAMS,
    )  # fmt: skip
    return value, grad


tracked_row = torch.library.custom_op(
    "topklab::tracked_row", mutates_args=("lam", "lam_last", "lam_width", "state", "work", "ticket"), device_types=None
)(tracked_row_launch)


@tracked_row.register_fake
def _(losses, lam, lam_last, lam_width, state, work, ticket, k, delta, scale, momentum, burn_in, relu):
    return losses.new_empty(losses.shape[:-1]), torch.empty_like(losses)


def attach_scratch(module) -> bool:
    """Whether ``module`` (MATk, STk) may take a launch (a rule that sets λ, ``kernel`` "auto" or
    "triton"), registering the buffers a launch over several programs needs (non-persistent: moved
    with it, never saved): where its rule tracks or solves long rows, the programs' partial sums and
    their tickets; for a long solved row the solve's state, and MATk's histogram of keys."""
    if not (module.rule.stored and module.kernel in ("auto", "triton")):
        return False
    long_solved = module.rule.lane(module, ON_CHIP + 1) == "solved"
    module.register_buffer("triton_work", torch.zeros(MOST_PROGRAMS * (SLOTS + 2)), persistent=False)
    module.register_buffer("triton_ticket", torch.zeros(MOST_PROGRAMS + 1, dtype=torch.int32), persistent=False)
    if module.rule.tracks:
        module.register_buffer("triton_no_width", torch.zeros(()), persistent=False)  # STk's stand-in for a window
    if long_solved:
        module.register_buffer("triton_solve", torch.zeros(SOLVE_SLOTS, dtype=torch.float64), persistent=False)
        if module.smoothing == "relu":
            module.register_buffer("triton_bins", torch.zeros(BINS, dtype=torch.int32), persistent=False)
    return True


def scale_gradient_launch(grad: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
    """``grad × incoming`` into a new tensor, rows (..., n) by each row's incoming gradient (one row: a
    0-d one), read on the device; ``incoming`` in any layout (an expanded one, as ``.sum()`` over rows
    passes, is made contiguous), ``grad`` left as it is (it stays saved for another backward). The op
    ``torch.ops.topklab.scale_gradient`` (:data:`scale_gradient`)."""
    kernel = kernels()["scale"]
    total = grad.numel()
    scaled = torch.empty_like(grad)
    kernel[(max(1, math.ceil(total / BLOCK)),)](grad, scaled, incoming.contiguous(), grad.shape[-1], total, BLOCK=BLOCK)
    return scaled


scale_gradient = torch.library.custom_op("topklab::scale_gradient", mutates_args=(), device_types=None)(
    scale_gradient_launch
)


@scale_gradient.register_fake
def _(grad, incoming):
    return torch.empty_like(grad)


def solved_row_launch(
    losses: torch.Tensor,
    lam: torch.Tensor,
    lam_last: torch.Tensor,
    state: torch.Tensor,
    work: torch.Tensor,
    ticket: torch.Tensor,
    k: int,
    delta: float,
    scale: float,
    momentum: float,
    burn_in: float,
    steps: int,
    relu: bool,
    shared: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One solved training call on ``losses`` (n,) or contiguous rows (P, n) of at most
    :data:`ON_CHIP` losses, one program a row: (value (0-d, or (P,)), ∂value/∂losses); each row's λ
    its root (STk: ``steps`` safeguarded steps from its ``lam_last``, or from its own k-th largest
    loss where the rows share one λ (``shared``); MATk: the exact k-th largest loss), ``lam``,
    ``lam_last`` (each row's, or under ``shared`` the rows' mean) and ``state`` updated in place, the
    rows' λ left in ``work`` from :data:`ROW_LAMS`. The op ``torch.ops.topklab.solved_row``
    (:data:`solved_row`)."""
    n = losses.shape[-1]
    grad = torch.empty_like(losses)
    value = losses.new_empty(losses.shape[:-1])
    kernel = kernels()["solved_row"]
    kernel[(losses.numel() // n,)](
        losses, grad, value, lam, lam_last, state, work, ticket, n, k, delta, scale, momentum, burn_in, steps,
        RELU=relu, SHARED=shared, BLOCK=max(16, triton_next_power_of_2(n)), PROGRAMS=MOST_PROGRAMS,
    )  # fmt: skip
    return value, grad


solved_row = torch.library.custom_op(
    "topklab::solved_row", mutates_args=("lam", "lam_last", "state", "work", "ticket"), device_types=None
)(solved_row_launch)


@solved_row.register_fake
def _(losses, lam, lam_last, state, work, ticket, k, delta, scale, momentum, burn_in, steps, relu, shared):
    return losses.new_empty(losses.shape[:-1]), torch.empty_like(losses)


def solved_long_row_launch(
    losses: torch.Tensor,
    lam: torch.Tensor,
    lam_last: torch.Tensor,
    state: torch.Tensor,
    work: torch.Tensor,
    ticket: torch.Tensor,
    solve: torch.Tensor,
    k: int,
    delta: float,
    scale: float,
    momentum: float,
    burn_in: float,
    steps: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """STk's solved training call on a row longer than :data:`ON_CHIP`: ``steps`` + 1 launches, one
    evaluation of the solve each (``solve.solve_srelu_threshold``'s steps from ``lam_last``, the best
    iterate kept): (value (0-d), the λ used (1,) for :func:`threshold_gradient_launch`); the buffers
    updated in place as :func:`tracked_row_launch` does, ``solve`` the state between launches. The op
    ``torch.ops.topklab.solved_long_row``."""
    n = losses.shape[0]
    programs, iters = launch_shape(n)
    value = losses.new_empty(())
    used = torch.empty(2, dtype=torch.float32, device=losses.device)
    kernel = kernels()["solve_pass"]
    for step in range(steps + 1):
        kernel[(programs,)](
            losses, lam, lam_last, state, work, ticket, solve, used, value,
            n, k, delta, scale, momentum, burn_in, iters,
            FIRST=step == 0, LAST=step == steps, BLOCK=BLOCK, PROGRAMS=MOST_PROGRAMS,
        )  # fmt: skip
    return value, used


solved_long_row = torch.library.custom_op(
    "topklab::solved_long_row", mutates_args=("lam", "lam_last", "state", "work", "ticket", "solve"), device_types=None
)(solved_long_row_launch)


@solved_long_row.register_fake
def _(losses, lam, lam_last, state, work, ticket, solve, k, delta, scale, momentum, burn_in, steps):
    return losses.new_empty(()), torch.empty(2, dtype=torch.float32, device=losses.device)


def selected_long_row_launch(
    losses: torch.Tensor,
    lam: torch.Tensor,
    lam_last: torch.Tensor,
    state: torch.Tensor,
    work: torch.Tensor,
    ticket: torch.Tensor,
    solve: torch.Tensor,
    bins: torch.Tensor,
    k: int,
    scale: float,
    momentum: float,
    burn_in: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MATk's solved training call on a row longer than :data:`ON_CHIP`: three launches, two counting
    passes of a radix select on the losses' ordered keys (the histogram ``bins``, zero between calls)
    for ℓ_[k], then the value there: (value (0-d), [λ, the tied losses' share] (2,) for
    :func:`threshold_gradient_launch`). The op ``torch.ops.topklab.selected_long_row``."""
    n = losses.shape[0]
    programs, iters = launch_shape(n)
    value = losses.new_empty(())
    used = torch.empty(2, dtype=torch.float32, device=losses.device)
    found = kernels()
    for low in (False, True):
        found["select_pass"][(programs,)](
            losses, bins, work, ticket, solve, n, k, iters, LOW=low, BLOCK=BLOCK, PROGRAMS=MOST_PROGRAMS
        )
    found["relu_value"][(programs,)](
        losses, lam, lam_last, state, work, ticket, solve, used, value,
        n, k, scale, momentum, burn_in, iters, BLOCK=BLOCK, PROGRAMS=MOST_PROGRAMS,
    )  # fmt: skip
    return value, used


selected_long_row = torch.library.custom_op(
    "topklab::selected_long_row",
    mutates_args=("lam", "lam_last", "state", "work", "ticket", "solve", "bins"),
    device_types=None,
)(selected_long_row_launch)


@selected_long_row.register_fake
def _(losses, lam, lam_last, state, work, ticket, solve, bins, k, scale, momentum, burn_in):
    return losses.new_empty(()), torch.empty(2, dtype=torch.float32, device=losses.device)


def threshold_gradient_launch(
    losses: torch.Tensor, used: torch.Tensor, incoming: torch.Tensor, delta: float, step: float, relu: bool
) -> torch.Tensor:
    """∂value/∂losses of a long solved row, recomputed in one launch: ``incoming`` (0-d, read on the
    device) × ``step`` × φ'(ℓ − λ) at ``used`` (MATk: its tied losses' share). The op
    ``torch.ops.topklab.threshold_gradient``."""
    grad = torch.empty_like(losses)
    n = losses.shape[0]
    kernels()["threshold_gradient"][(max(1, math.ceil(n / BLOCK)),)](
        losses, grad, used, incoming, n, delta, step, RELU=relu, BLOCK=BLOCK
    )
    return grad


threshold_gradient = torch.library.custom_op("topklab::threshold_gradient", mutates_args=(), device_types=None)(
    threshold_gradient_launch
)


@threshold_gradient.register_fake
def _(losses, used, incoming, delta, step, relu):
    return torch.empty_like(losses)


def triton_next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _eager(tensor: torch.Tensor) -> bool:
    """Whether a launch on ``tensor`` may skip the op's dispatch: a plain tensor, nothing tracing."""
    return type(tensor) is torch.Tensor and not torch.compiler.is_compiling()


LAUNCHES = {
    "tracked": tracked_row_launch,
    "solved": solved_row_launch,
    "solved_long": solved_long_row_launch,
    "selected_long": selected_long_row_launch,
}
OPS = {
    "tracked": "tracked_row",
    "solved": "solved_row",
    "solved_long": "solved_long_row",
    "selected_long": "selected_long_row",
}


class _Row(torch.autograd.Function):
    """A row's launch (:data:`LAUNCHES`), differentiable in the losses. ``gradient`` None: the launch
    writes the gradient, saved and scaled by the incoming one in the backward (one
    :func:`scale_gradient_launch`); else (δ, s/n, relu): the launch returns the λ it used and the
    backward recomputes the gradient from the losses there (one :func:`threshold_gradient_launch`). A
    mutating op has no autograd formula of its own. Through the registered ops (:data:`OPS`) where
    ``torch.compile`` traces, directly otherwise (the dispatch of a Python op costs tens of
    microseconds a call)."""

    @staticmethod
    def forward(ctx, entry, gradient, losses, *args):
        launch = LAUNCHES[entry] if _eager(losses) else getattr(torch.ops.topklab, OPS[entry])
        value, saved = launch(losses, *args)
        ctx.save_for_backward(saved) if gradient is None else ctx.save_for_backward(losses, saved)
        ctx.gradient, ctx.inputs = gradient, len(args) + 3
        return value

    @staticmethod
    def backward(ctx, grad_value):
        if ctx.gradient is None:
            (saved,) = ctx.saved_tensors
            grad = (scale_gradient_launch if _eager(saved) else torch.ops.topklab.scale_gradient)(saved, grad_value)
        else:
            losses, used = ctx.saved_tensors
            recompute = threshold_gradient_launch if _eager(losses) else torch.ops.topklab.threshold_gradient
            grad = recompute(losses, used, grad_value, *ctx.gradient)
        return (None, None, grad) + (None,) * (ctx.inputs - 3)


def row_call(module, losses: torch.Tensor) -> torch.Tensor | None:
    """A training call of ``module`` (MATk, STk) on ``losses`` in Triton launches: one row (n,) or
    rows (P, n) reduced over the last dim, in any layout (made contiguous), each with its own λ (``rows=P``) or sharing one
    (``rows=None``, each row solved from its own k-th largest loss): a tracked call
    (:func:`tracked_row_launch`), a solved one on at most :data:`ON_CHIP` losses a row
    (:func:`solved_row_launch`) or on one longer row (:func:`solved_long_row_launch`,
    :func:`selected_long_row_launch`). None where none applies (the torch path): ``kernel`` is not
    "triton" (nor "auto" on CUDA with Triton here), the module's first call, a rule that trains λ, λ
    buffers not in float32, a tensor k, more than :data:`MOST_PROGRAMS` rows, several long solved rows,
    shared rows under a rule that tracks at their length (each solved as the torch path's first call)."""
    if module.kernel != "triton" and not (module.kernel == "auto" and losses.is_cuda and available()):
        return None
    if not (module.training and torch.is_grad_enabled()) or losses.dtype not in TRITON_DTYPES:
        return None
    if losses.dim() not in (1, 2) or (losses.dim() == 2 and module.dim % 2 != 1):
        return None
    n, rows = losses.shape[-1], (losses.shape[0] if losses.dim() == 2 else 1)
    buffers, monitor = module._buffers, module.monitor
    shared = module.rows is None and rows > 1
    if (
        n == 0
        or rows > MOST_PROGRAMS
        or module.rows not in (None, rows)
        or (module.rows is not None and losses.dim() == 1)
        or isinstance(module.k, torch.Tensor)
        or not module._started
        or monitor._state is None
        or buffers["lam_last"].dtype != torch.float32
        or (not torch.compiler.is_compiling() and torch._C._functorch.is_functorch_wrapped_tensor(losses))
    ):
        return None
    losses = losses.contiguous()  # the launches read rows of n at a stride of one (a no-op where they are)
    relu = module.smoothing == "relu"
    tracked = module.rule.uses_last(module, n) and not shared
    solved = module.rule.lane(module, n) == "solved"
    if not tracked and not (solved and (n <= ON_CHIP or rows == 1)):
        return None
    count = resolve_count(module.k, n)
    compiling = torch.compiler.is_compiling()
    sample = not compiling and monitor.native_call(count, n)
    used = buffers["lam_last"].clone() if sample and tracked else None
    settings = (count, float(module.delta or 0.0), float(n / count) if module.scale == "atk" else 1.0)
    settings += (module.rule.lam_momentum, float(monitor.burn_in))
    scratch = (buffers["triton_work"], buffers["triton_ticket"])
    state = (buffers["lam"], buffers["lam_last"])
    if tracked:
        width = buffers.get("lam_width", buffers["triton_no_width"])
        value = _Row.apply("tracked", None, losses, *state, width, monitor._state, *scratch, *settings, relu)
    elif n <= ON_CHIP:
        steps = module.rule.steps_at(n)
        value = _Row.apply("solved", None, losses, *state, monitor._state, *scratch, *settings, steps, relu, shared)
    elif relu:
        gradient = (settings[1], settings[2] / n, relu)
        state += (monitor._state, *scratch, buffers["triton_solve"], buffers["triton_bins"])
        value = _Row.apply("selected_long", gradient, losses, *state, settings[0], *settings[2:])
    else:
        gradient = (settings[1], settings[2] / n, relu)
        state += (monitor._state, *scratch, buffers["triton_solve"])
        value = _Row.apply("solved_long", gradient, losses, *state, *settings, module.rule.steps_at(n))
    if sample:
        lam = used if tracked else (scratch[0][ROW_LAMS : ROW_LAMS + rows] if n <= ON_CHIP else buffers["lam_last"])
        block = losses.detach().view(rows, n)
        monitor.add_sample(*module._sampler(block, lam.to(losses.dtype).reshape(-1).expand(rows), None, count)())
    if not compiling and monitor.calls % WARN_AFTER_CALLS == 0:
        lam, share = buffers["lam_last"], module._row_shares  # the smoothed share for the warning's message
        monitor.check_streak(
            lambda: share(losses.detach().view(rows, n), lam.to(losses.dtype).reshape(-1).expand(rows)).mean(), count, n
        )
    return value
