"""Triton's launch path on a machine without a GPU: a stand-in CUDA driver and kernel caches of their own,
so that a benchmark can drive STk's and MATk's Triton calls on CPU tensors through Triton's JIT (binding,
specialisation, the cache, the globals' check, the grid) and decide what each first use of a
specialisation puts in the cache: a counted no-op (:mod:`benchmarks.triton_host`) or the kernel Triton's
compiler really builds for a CUDA target, with its launch a no-op (:mod:`benchmarks.triton_compile`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from unittest import mock

from topklab.losses.aggregate import triton_pass
from topklab.utils.errors import TopklabError


class StandInDriver:
    """What Triton's launch path asks of its CUDA driver, answered without one: device 0, stream 0 and a
    target of compute capability ``arch`` (90: H100/H200)."""

    def __init__(self, arch: int = 90):
        self.arch = arch

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget  # noqa: PLC0415

        return GPUTarget("cuda", self.arch, 32)


class Launches:
    """A count of the launches the no-op kernels took."""

    def __init__(self):
        self.launches = 0


class NoOpKernel:
    """A compiled kernel as Triton's ``run`` finds it in its cache, its launcher doing nothing but count
    in ``counter``."""

    function, packed_metadata = 0, ()

    def __init__(self, counter: Launches):
        self.counter = counter

    def launch_metadata(self, grid, stream, *args) -> None:
        return None

    def run(self, *args) -> None:
        self.counter.launches += 1


@contextmanager
def stand_in_launches(cached: Callable, arch: int = 90):
    """Triton's launch path up to its CUDA launcher, on a :class:`StandInDriver` for ``arch``.

    Parameters
    ----------
    cached : ``cached(kernel, build, constexprs)`` is called on the first use of each specialisation of
        each kernel of :func:`~topklab.losses.aggregate.triton_pass.kernels` (``kernel`` its
        ``JITFunction``, ``build()`` Triton's own compile of it for the target, returning the
        ``CompiledKernel``, ``constexprs`` the specialisation's compile-time arguments by name); what it
        returns is cached and launched from then on (a :class:`NoOpKernel`, whatever ``build`` gave).
    arch : the target's compute capability (80 A100, 90 H100/H200, 100 B200, 120 RTX 50)

    The kernels' own caches are put back afterwards. Needs Triton's JIT: a one-line error under its
    interpreter (``TRITON_INTERPRET=1``), which has no launch path and compiles nothing.
    """
    from triton.runtime import driver  # noqa: PLC0415
    from triton.runtime.jit import JITFunction  # noqa: PLC0415

    kernels = triton_pass.kernels().values()
    if not all(isinstance(kernel, JITFunction) for kernel in kernels):
        raise TopklabError(
            "Triton's launch path and compiler need its JIT; unset TRITON_INTERPRET (the interpreter has neither)"
        )
    triton_compile = JITFunction._do_compile

    def first_use(self, key, signature, device, constexprs, options, attrs, warmup):
        self.cache_key  # noqa: B018  (a compile reads it: it records the globals each launch then checks)

        def build():
            return triton_compile(self, key, signature, device, constexprs, options, attrs, warmup)

        names = list(signature)
        constants = {names[path[0]]: value for path, value in constexprs.items()}
        kernel = self.device_caches[device][0][key] = cached(self, build, constants)
        return kernel

    saved = {kernel: kernel.device_caches for kernel in kernels}
    for kernel in kernels:
        kernel.device_caches = defaultdict(kernel.create_binder)
    try:
        with (
            mock.patch.object(driver, "_active", StandInDriver(arch)),
            mock.patch.object(JITFunction, "_do_compile", first_use),
        ):
            yield
    finally:
        for kernel, caches in saved.items():
            kernel.device_caches = caches
