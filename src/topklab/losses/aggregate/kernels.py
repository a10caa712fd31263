"""Fused kernels of the thresholded aggregates (MATk, STk): the value **and** its gradients in one
pass over the losses, so the backward only scales (STk paper Eqs. 5 and 6, batched over rows).

Per row p of ``losses`` (P, n), with x = ℓ − λ_p, s_p the row's output scale (1 for the paper's
scale, n/k_p for ``scale="atk"``):

- value_p = s_p·[(1/n)·Σ_i φ_δ(x_pi) + (k_p/n)·λ_p]
- ∂value_p/∂ℓ_pi = (s_p/n)·φ'(x_pi)
- ∂value_p/∂λ_p = −Σ_i ∂value_p/∂ℓ_pi + s_p·(k_p/n)

The gradients are rounded as autograd rounds the graph of the formula (:meth:`Smoothing.slope`),
so for an incoming gradient of one (or any power of two: a sum of rows, AMP's loss scale) the eager
kernel trains bit for bit as the formula would under autograd; other incoming gradients scale the
result afterwards, one rounding apart. Three paths compute it:

The mean of φ is summed in float64 with each term divided by n first, on every path, so that no
row of finite losses overflows where its mean is finite (the gradients' sums keep the dtype
autograd would use). Float16 and bfloat16 rows are computed in float32 on every path, k included
(:func:`thresholded` converts them; the C++ kernel itself takes float32 and float64).

- ``eager``: the Python functions below, on torch operations;
- ``compiled``: the same functions through ``torch.compile`` (inductor: C++ on CPU, Triton on
  CUDA), fused into one loop over the losses with float64 accumulators;
- ``native`` (CPU): ``thresholded_cpu.cpp``, the same per-element formulas in one C++ loop with
  float64 accumulators and its autograd node in C++ (no Python in the call or the backward),
  prebuilt with the package (else built on first use, which needs a C++ compiler and ninja:
  :mod:`topklab.utils.native`). The same
  extension solves STk's λ (:func:`native_solve`, used by :func:`~topklab.losses.aggregate.solve.
  solve_srelu_threshold` on this path) and gives Average and ATk one node for a row of losses
  (:func:`native_if_loaded`).

All three agree to float32 rounding (``tests/losses/test_kernels.py``). :class:`ThresholdedTopK` picks the
path per call with its ``kernel`` field; where a path cannot be built, ``auto`` warns once and falls
back (native → compiled → eager).

Unlike autograd of the formula, the fused node cannot be differentiated twice, nor used under
``torch.func`` transforms; a user's ``torch.compile`` of a model around it breaks the graph there.
"""

from __future__ import annotations

import platform
import warnings
from functools import cache
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

from topklab.losses.aggregate.base import accumulation_dtype
from topklab.smoothing import Smoothing
from topklab.utils.errors import TopklabError, first_line
from topklab.utils.native import find_prebuilt, load_native

KERNELS = ("auto", "native", "compiled", "eager", "triton")  # triton: the tracked call's one launch (triton_pass)
NEXT_PATH = {"native": "compiled", "compiled": "eager"}  # where a path that cannot be built falls back to
NATIVE_SOURCE = Path(__file__).with_name("thresholded_cpu.cpp")


def thresholded_value(losses, lam, delta, k, scale, *, phi: Smoothing, accumulate: torch.dtype = None):
    """value_p of every row (P,); see the module docstring. The mean of φ is summed in float64
    (:meth:`Smoothing.row_mean`); ``accumulate`` is that of the gradients' sums (the signature is
    :func:`thresholded_value_and_grads`'s)."""
    n = losses.shape[1]
    x = losses - lam[:, None]
    hinge = phi.row_mean(x, delta[:, None])
    return (hinge + k / n * lam) * scale


def thresholded_value_and_grads(losses, lam, delta, k, scale, *, phi: Smoothing, accumulate: torch.dtype = None):
    """(value (P,), ∂value/∂losses (P, n), ∂value/∂λ (P,)) in one pass; see the module docstring."""
    n = losses.shape[1]
    x = losses - lam[:, None]
    accumulate = accumulate or losses.dtype
    hinge, grad_losses = phi.row_mean_and_slope(x, delta[:, None], (scale / n)[:, None])
    grad_lam = (-grad_losses.to(accumulate).sum(1)).to(losses.dtype) + scale * (k / n)
    return (hinge + k / n * lam) * scale, grad_losses, grad_lam


def _python_kernel(with_grads: bool):
    return thresholded_value_and_grads if with_grads else thresholded_value


@cache
def compiled(phi: Smoothing, with_grads: bool, device_type: str, dtype: torch.dtype, single_row: bool):
    """The ``torch.compile``-d kernel of ``phi`` for one device type, dtype and row count class (one
    row, as in a module's forward, or several, as in a population): dynamic shapes, so one compilation
    serves every n >= 2 and every number of rows > 1."""
    kernel = _python_kernel(with_grads)

    def fused(losses, lam, delta, k, scale):
        return kernel(losses, lam, delta, k, scale, phi=phi, accumulate=torch.float64)

    fused.__code__ = fused.__code__.replace()  # its own code object: dynamo's recompile budget is per code object
    return torch.compile(fused, dynamic=True, options=vector_width_option())


VECTOR_BITS = {"default": 0, "avx2": 256, "avx512": 512}  # torch's CPU capability -> inductor's cpp.simdlen


def vector_width_option() -> dict:
    """Inductor's ``cpp.simdlen`` pinned to the vector width of torch's own CPU kernels (x86; {} elsewhere).
    Inductor picks its C++ vector set from ``ATEN_CPU_CAPABILITY`` at every compile, but its on-disk
    graph cache keys the config, not the variable: a kernel compiled under ``avx2`` was reloaded by an
    ``avx512`` process and returned wrong sums, then corrupted the heap. A pinned width is part of the
    config, so each vector set has its own cache entries, and the compiled kernels use the vector set
    that the run's identity records (``cpu_capability``).

    Examples
    --------
    >>> option = vector_width_option()
    >>> option == {} or option["cpp.simdlen"] in VECTOR_BITS.values()
    True
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    bits = VECTOR_BITS.get(torch.backends.cpu.get_cpu_capability().lower())
    return {} if bits is None else {"cpp.simdlen": bits}


NATIVE_MODULE = "topklab.losses.aggregate._thresholded_cpu"


@cache
def native_extension():
    """The C++ kernel (``thresholded_cpu.cpp``): prebuilt with the package, else built on first use
    and cached on disk by torch (:func:`~topklab.utils.native.load_native`)."""
    extension = load_native(NATIVE_MODULE, NATIVE_SOURCE, "topklab_thresholded")
    _LOADED.append(extension)
    return extension


_LOADED: list = []  # the loaded extension, once native_extension() has returned it
_NOT_PREBUILT: list = []  # True once native_if_loaded() found no prebuilt extension to import


def native_if_loaded():
    """The C++ extension where it is loaded in this process or prebuilt for this source and torch (then
    imported), else None: never a build. For Average and ATk, whose fallback is their torch expression
    and for which a first-use build (tens of seconds) would cost more than it saves."""
    if not _LOADED and not _NOT_PREBUILT and not torch.compiler.is_compiling():
        if find_prebuilt(NATIVE_MODULE, NATIVE_SOURCE)[0] is None:
            _NOT_PREBUILT.append(True)
        else:
            native_extension()
    return _LOADED[0] if _LOADED else None


_UNAVAILABLE: dict[tuple[str, str], str] = {}  # (path, device type) -> why it could not be built there


def compiler_error(path: str, device: torch.device) -> str | None:
    """Why ``path`` ("native" or "compiled") failed on this device type in this process (None: not known to fail)."""
    return _UNAVAILABLE.get((path, device.type))


def native_ready(values: torch.Tensor, fallback: str, required: bool = False) -> bool:
    """Whether the C++ extension can serve ``values``: a float32/float64 CPU tensor, outside a user's
    ``torch.compile``, and an extension that builds here. A build failure warns once per process
    (``fallback`` says what runs instead) and gives False, or under ``required`` (``kernel=native``)
    raises a :class:`TopklabError`."""
    if values.device.type != "cpu" or values.dtype not in (torch.float32, torch.float64):
        return False
    if torch.compiler.is_compiling() or ("native", "cpu") in _UNAVAILABLE:
        return False
    try:
        native_extension()
    except Exception as error:
        failure = first_line(error)
        if required:
            raise TopklabError(
                f"loss.kernel=native, but that kernel failed on cpu: {failure}; use loss.kernel=auto or eager"
            ) from None
        _UNAVAILABLE[("native", "cpu")] = failure
        warnings.warn(
            f"the native kernel of the thresholded losses failed on cpu ({failure}); {fallback}", stacklevel=3
        )
        return False
    return True


def native_built() -> bool:
    """Whether the C++ extension is loaded in this process (a cheap check: no build)."""
    return bool(_LOADED)


def native_solve(losses, k, delta, start, steps: int, required: bool = False):
    """:func:`~topklab.losses.aggregate.solve.solve_srelu_threshold`'s ``(λ, count)`` from the C++ kernel,
    or None where it cannot run (:func:`native_ready`)."""
    fallback = "solving λ with the eager torch operations instead (the same root to float32 rounding)"
    if not native_ready(losses, fallback, required):
        return None
    lam, count = native_extension().solve_srelu(losses, k, delta, start, steps)
    return lam, count


def _kernel(path: str, phi: Smoothing, with_grads: bool, losses: torch.Tensor):
    """The eager or compiled Python kernel for these losses."""
    if path == "compiled":
        return compiled(phi, with_grads, losses.device.type, losses.dtype, losses.shape[0] == 1)
    kernel = _python_kernel(with_grads)
    return lambda *args: kernel(*args, phi=phi)


def _all_ones(grad: torch.Tensor) -> bool:
    """Whether a CPU gradient is exactly one everywhere (False on a GPU, where the check would synchronise,
    and while torch.compile traces, where it would break the graph)."""
    if grad.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    return grad.item() == 1.0 if grad.numel() == 1 else bool((grad == 1).all())


class _Thresholded(torch.autograd.Function):
    """Runs the eager or compiled kernel in the forward and keeps its gradients; the backward scales
    them by the incoming gradient (skipped on CPU when it is exactly one). A second backward through
    the same graph (``retain_graph=True``) recomputes them."""

    @staticmethod
    def forward(ctx, losses, lam, delta, k, scale, phi, path):
        args = (losses.detach(), lam.detach(), delta, k, scale)  # one compiled graph, whether or not they need grad
        value, grad_losses, grad_lam = _kernel(path, phi, True, losses)(*args)
        ctx.save_for_backward(*args)
        ctx.settings = (path, phi)
        ctx.grads = (grad_losses if ctx.needs_input_grad[0] else None, grad_lam)
        return value

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_value):
        if ctx.grads is None:
            path, phi = ctx.settings
            _, grad_losses, grad_lam = _kernel(path, phi, True, ctx.saved_tensors[0])(*ctx.saved_tensors)
        else:
            (grad_losses, grad_lam), ctx.grads = ctx.grads, None
        if not _all_ones(grad_value):
            grad_losses = None if grad_losses is None else grad_losses.mul_(grad_value[:, None])
            grad_lam = grad_lam * grad_value
        return (
            grad_losses if ctx.needs_input_grad[0] else None,
            grad_lam if ctx.needs_input_grad[1] else None,
            None,
            None,
            None,
            None,
            None,
        )


def _call(path: str, phi: Smoothing, with_grads: bool, args: tuple) -> torch.Tensor:
    if path == "native":
        if with_grads:
            return native_extension().thresholded(*args, phi.native_id)
        return native_extension().run(*args, phi.native_id, False)[0]
    if with_grads:
        return _Thresholded.apply(*args, phi, path)
    return _kernel(path, phi, False, args[0])(*args)


def thresholded(losses, lam, delta, k, scale, phi: Smoothing, path: str = "eager", required: bool = False):
    """value_p (P,) for every row of ``losses`` (P, n), differentiable in the losses and λ.

    Float16 and bfloat16 rows are computed in float32 (the losses, λ, δ, k and the scale, so that
    every count is exact) and the value is returned in their dtype; float32 and float64 rows in
    their own dtype, k and the other per-row settings converted to it.

    Parameters
    ----------
    losses : Tensor (P, n), per-sample losses, one row per member
    lam : Tensor (P,), the effective threshold λ of each row
    delta : Tensor (P,), the smoothing width δ > 0 of each row (ignored by all but SReLU)
    k : Tensor (P,), the count k of each row, in [1, n] (float32 or float64: a half dtype cannot
        hold every count above 256)
    scale : Tensor (P,), the output scale s of each row (ones, or n/k for MATk's ATk scale)
    phi : the smoothing (:data:`topklab.smoothing.SMOOTHINGS`)
    path : {"eager", "compiled", "native"}, the kernel (see the module docstring); a path that
        cannot be built here falls back (native → compiled → eager) with one warning per process,
        unless ``required``
    required : raise a :class:`TopklabError` instead of falling back (``kernel=compiled|native``)

    Examples
    --------
    >>> from topklab.smoothing import SMOOTHINGS
    >>> losses = torch.tensor([[1.0, 5.0, 3.0, 0.0]], requires_grad=True)
    >>> lam, one = torch.tensor([3.0], requires_grad=True), torch.ones(1)
    >>> value = thresholded(losses, lam, one, 2 * one, one, SMOOTHINGS["relu"])
    >>> value  # MATk at λ = ℓ_[2]: (1/4)·2 + (2/4)·3
    tensor([2.], grad_fn=<_ThresholdedBackward>)
    >>> value.sum().backward(); losses.grad, lam.grad
    (tensor([[0.0000, 0.2500, 0.0000, 0.0000]]), tensor([0.2500]))
    """
    constants = [name for name, t in (("delta", delta), ("k", k), ("scale", scale)) if t.requires_grad]
    if constants:
        raise ValueError(f"{', '.join(constants)} of a thresholded aggregate are constants; pass them detached")
    if path not in NEXT_PATH and path != "eager":
        raise ValueError(f"unknown kernel path {path!r}; choose one of: eager, compiled, native")
    dtype = accumulation_dtype(losses.dtype)
    args = tuple(t.to(dtype) for t in (losses, lam, delta, k, scale))
    return _run(args, phi, path, required).to(losses.dtype)


def _run(args: tuple, phi: Smoothing, path: str, required: bool) -> torch.Tensor:
    """:func:`thresholded` on ``args`` in one dtype: the first path of ``path``'s fallback chain that runs."""
    losses, lam = args[:2]
    with_grads = torch.is_grad_enabled() and (losses.requires_grad or lam.requires_grad)
    device_type = losses.device.type
    if path == "native" and device_type != "cpu":
        path = "compiled"  # the C++ kernel is CPU code; on a GPU, Triton through torch.compile
    while path != "eager":
        failure = _UNAVAILABLE.get((path, device_type))
        if failure is None:
            try:
                return _call(path, phi, with_grads, args)
            except Exception as error:
                _call("eager", phi, False, args)  # an error of the inputs raises here, not blamed on the kernel
                failure = first_line(error)
                if not required:
                    _UNAVAILABLE[(path, device_type)] = failure
                    warnings.warn(
                        f"the {path} kernel of the thresholded losses failed on {device_type} ({failure}); "
                        f"using the {NEXT_PATH[path]} kernel instead (the same values to float32 rounding). "
                        f"Set loss.kernel to skip the attempt",
                        stacklevel=3,
                    )
        if required:
            raise TopklabError(
                f"loss.kernel={path}, but that kernel failed on {device_type}: {failure}; use loss.kernel=auto or eager"
            )
        path = NEXT_PATH[path]
    return _call("eager", phi, with_grads, args)
