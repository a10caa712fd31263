"""The benchmarks (``scripts/bench_*.py`` are their entry points, one module each here), the harness they
share (:mod:`~topklab.bench.timing`, :mod:`~topklab.bench.isolation`, :mod:`~topklab.bench.memory`,
:mod:`~topklab.bench.compare`, :mod:`~topklab.bench.output`; all re-exported by
:mod:`~topklab.bench.harness`), and the top-k sum solvers of the STk paper's Table 1 (:mod:`~topklab.bench.topk_sum`)."""
