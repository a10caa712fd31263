"""The λ monitor's counts when its calls run inside ``torch.compile(fullgraph=True)``, against eager calls.

Under inductor the monitor's counters, made inside the first compiled graph, were returned as one
buffer wherever inductor's joint-graph passes proved their values equal (the in-band hits and all
in-band hits when the first compiled call is past the burn-in: a fresh run with no burn-in, or a
resumed one), so that each later call added its hit to both: 9 in-band hits where eager counts 5.
Only inductor did so (aot_eager generates no code and runs no such pass): its cases are slow; the
aot_eager ones check the counts and that the calls do not recompile each time.
"""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from topklab.losses.aggregate.lambda_monitor import LambdaMonitor

SHARES = [0.5, 0.9, 0.5, 0.05, 0.5, 0.5, 0.3]  # k/n = 1/2: in band within [0.25, 0.75]
SITUATIONS = {  # burn_in, the calls of a resumed run (None: a fresh monitor)
    "fresh": (0, None),
    "in-burn-in": (3, None),
    "resumed-after-burn-in": (10, 50),
}
BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]


def monitor_for(situation: str) -> LambdaMonitor:
    burn_in, resumed = SITUATIONS[situation]
    monitor = LambdaMonitor()
    monitor.burn_in = burn_in
    if resumed is not None:
        monitor.load_state_dict({"calls": resumed, "warned": False})
    return monitor


@pytest.mark.parametrize("situation", list(SITUATIONS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_calls_count_as_eager_ones_without_a_recompile_per_call(backend, situation):
    torch._dynamo.reset()
    compiled, eager = monitor_for(situation), monitor_for(situation)

    def call(share):
        compiled.record(share, 1, 2)
        return share * 2

    counter = CompileCounterWithBackend(backend)
    step = torch.compile(call, fullgraph=True, backend=counter)
    for share in SHARES:
        step(torch.tensor(share))
        eager.record(torch.tensor(share), 1, 2)
    ours, reference = compiled.pop_epoch(), eager.pop_epoch()
    assert ours.pop("smoothed_share") == pytest.approx(reference.pop("smoothed_share"), rel=1e-6)
    assert ours == reference | {"hard_share": None, "lam_minus_kth": None}  # no samples while compiling
    assert ours["lam_calls"] == len(SHARES)
    assert counter.frame_count <= 2  # the first call (which makes the counters), then one graph for the rest
    # the next epoch starts from zero, and a compiled call still adds once to each count
    step(torch.tensor(0.5))
    assert compiled.pop_epoch()["lam_in_band_all_hits"] == 1
