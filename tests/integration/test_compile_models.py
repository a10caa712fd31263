"""Models whose loss is STk, MATk or a top-k cross-entropy over a sorting network, under
``torch.compile(model, fullgraph=True)`` with dynamo's default configuration: no
``capture_scalar_outputs``, no ``torch.compiler.disable`` around the loss. The default tier checks
with ``torch._dynamo.explain`` that the forward (with DiffSortNet's hand-written backward, which
dynamo traces with it) is captured as one graph without a break; the slow tier trains 10 SGD steps
compiled (inductor) and eager from the same initialisation and data and compares the loss and
every parameter's gradient at each step.

MATk/STk cases cover λ solved and trained, from λ₀ = 0 and from ``lam_init="auto"`` (set on the first
training call without reading the value on the host); the λ monitor keeps only on-device sums under
compile, so the 10 steps do not recompile per call.
"""

import copy

import pytest
import torch
from torch import nn

from topklab.losses import MATk, STk, TopKCrossEntropy
from topklab.losses.individual import Logistic
from topklab.operators import DiffSortNet

FEATURES, CLASSES, BATCH = 5, 6, 32


class AggregatedLogistic(nn.Module):
    """Linear scores → per-sample logistic loss (labels ±1) → an aggregate; forward returns the loss."""

    def __init__(self, aggregate: nn.Module):
        super().__init__()
        self.linear, self.individual, self.aggregate = nn.Linear(FEATURES, 1), Logistic(), aggregate

    def forward(self, x, y):
        return self.aggregate(self.individual(self.linear(x).squeeze(-1), y))


class TopKClassifier(nn.Module):
    """Linear logits over 6 classes → top-k cross-entropy with P_K over k = 1..3 through a
    DiffSortNet (bitonic: strided and gathered layers; odd-even: strided) → batch mean; forward
    returns the loss."""

    def __init__(self, network: str):
        super().__init__()
        self.linear = nn.Linear(FEATURES, CLASSES)
        operator = DiffSortNet(network, steepness=2.0)
        self.loss = TopKCrossEntropy(p_k=[0.5, 0.25, 0.25], operator=operator, num_classes=CLASSES)

    def forward(self, x, y):
        return self.loss(self.linear(x), y).mean()


MODELS = {
    # the path a compiled call takes; δ wide against the losses' spacing: a track step divides the
    # count's rounding by its slope in λ, near 0 between losses many δ apart, and λ would drift apart
    "stk-track": lambda: AggregatedLogistic(STk(k=0.5, delta=0.5, kernel="eager")),
    "stk-solve": lambda: AggregatedLogistic(STk(k=0.5, lam_update="solve")),
    "stk-gradient": lambda: AggregatedLogistic(STk(k=0.5, lam_update="gradient", lam_init=0.0)),
    "matk-track": lambda: AggregatedLogistic(MATk(k=0.5)),
    "matk-solve": lambda: AggregatedLogistic(MATk(k=0.5, lam_update="solve")),
    "matk-gradient": lambda: AggregatedLogistic(MATk(k=0.5, lam_update="gradient", lam_init=0.0)),
    "stk-gradient-auto-init": lambda: AggregatedLogistic(STk(k=0.5, lam_update="gradient")),
    "matk-gradient-auto-init": lambda: AggregatedLogistic(MATk(k=0.5, lam_update="gradient")),
    "topk-ce-bitonic": lambda: TopKClassifier("bitonic"),
    "topk-ce-odd-even": lambda: TopKClassifier("odd_even"),
}


def batch(name: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(BATCH, FEATURES, generator=generator)
    if name.startswith("topk-ce"):
        return x, torch.randint(0, CLASSES, (BATCH,), generator=generator)
    return x, torch.randint(0, 2, (BATCH,), generator=generator).float() * 2 - 1


def at(step: int):
    """An ``assert_close`` message: its own, after the step."""
    return lambda message: f"step {step}: {message}"


@pytest.mark.parametrize("name", list(MODELS))
def test_the_model_and_its_loss_trace_as_one_graph(name):
    assert not torch._dynamo.config.capture_scalar_outputs  # dynamo's default: .item() would break the graph
    torch._dynamo.reset()
    torch.manual_seed(0)
    explanation = torch._dynamo.explain(MODELS[name]())(*batch(name, torch.Generator().manual_seed(0)))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def train_both(name: str):
    """Inductor (C++ on a CPU) against eager from the same initialisation and batches, 10 SGD steps: the
    loss, every parameter's gradient and then the whole state (parameters, λ and its buffers) within
    rtol 1e-5 and atol 1e-6 at each step (generated kernels may sum in another order). Returns both models."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = MODELS[name]()
    twin = copy.deepcopy(eager)
    models = {"eager": eager, "compiled": torch.compile(twin, fullgraph=True)}
    optimizers = {"eager": torch.optim.SGD(eager.parameters(), lr=0.1)}
    optimizers["compiled"] = torch.optim.SGD(twin.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    for step in range(10):  # under fullgraph=True a recompile beyond dynamo's limit raises: no silent eager
        x, y = batch(name, generator)
        values = {}
        for run, model in models.items():
            optimizers[run].zero_grad()
            values[run] = model(x, y)
            values[run].backward()
        torch.testing.assert_close(values["compiled"], values["eager"], rtol=1e-5, atol=1e-6, msg=at(step))
        for a, b in zip(eager.parameters(), twin.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=at(step))
        for optimizer in optimizers.values():
            optimizer.step()
        torch.testing.assert_close(twin.state_dict(), eager.state_dict(), rtol=1e-5, atol=1e-6, msg=at(step))
    return eager, twin


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_ten_compiled_training_steps_give_the_eager_values_and_gradients(name):
    train_both(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in MODELS if not name.startswith("topk-ce")])
def test_the_lambda_monitor_counts_compiled_calls_as_eager_ones(name):
    eager, twin = train_both(name)
    counted = ("lam_calls", "lam_in_band_counted", "lam_in_band_hits", "lam_in_band_all_hits")
    compiled, reference = twin.aggregate.monitor.pop_epoch(), eager.aggregate.monitor.pop_epoch()
    assert compiled["lam_calls"] == 10
    assert {key: compiled[key] for key in counted} == {key: reference[key] for key in counted}
    assert compiled["smoothed_share"] == pytest.approx(reference["smoothed_share"], rel=1e-5)


def test_under_compile_a_sorting_network_gives_eager_rows_and_nan_where_a_score_is_infinite():
    """Dynamo's graph run eagerly (backend "eager"): finite rows get eager mode's P and gradient (to
    float32 rounding: a unit in the last place here and there); a row with an infinite score, which
    eager mode gives its own smaller network, is NaN (regrouping rows by their finite count would
    read the data on the host) and passes no gradient."""
    torch._dynamo.reset()
    operator = DiffSortNet("odd_even", steepness=2.0)
    scores = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    scores[2, 1] = float("inf")
    weights = torch.randn(4, 4, 2, generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(lambda s: operator.permutation(s, 2), fullgraph=True, backend="eager")
    a, b = scores.clone().requires_grad_(True), scores.clone().requires_grad_(True)
    ours, eager = compiled(a), operator.permutation(b, 2)
    (ours.nan_to_num() * weights).sum().backward()
    (eager * weights).sum().backward()
    finite = [0, 1, 3]
    torch.testing.assert_close(ours[finite], eager[finite])
    torch.testing.assert_close(a.grad[finite], b.grad[finite])
    assert ours[2].isnan().all() and not a.grad[2].any()
