"""MATk and STk under torch.compile: one graph (fullgraph=True), the same values and gradients as eager.
The aot_eager backend captures forward and backward as inductor would, without generating code."""

import pytest
import torch

from topklab.losses import MATk, STk


@pytest.mark.parametrize("cls", [STk, MATk])
def test_a_thresholded_loss_compiles_as_one_graph_and_matches_eager(cls):
    torch._dynamo.reset()
    compiled_loss, eager_loss = cls(k=0.5), cls(k=0.5, kernel="eager")  # inside a compile the kernel is eager
    compiled = torch.compile(lambda values: compiled_loss(values), fullgraph=True, backend="aot_eager")
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):  # the first call sets λ from the batch, the next ones warm-start from it
        losses = torch.rand(64, generator=generator)
        a, b = losses.clone().requires_grad_(True), losses.clone().requires_grad_(True)
        value_a, value_b = compiled(a), eager_loss(b)
        value_a.backward()
        value_b.backward()
        torch.testing.assert_close(value_a, value_b)
        torch.testing.assert_close(a.grad, b.grad)
        torch.testing.assert_close(compiled_loss.lam_last, eager_loss.lam_last)


@pytest.mark.parametrize("cls", [STk, MATk])
def test_batches_of_changing_length_do_not_recompile_per_length(cls):
    """Token losses come in batches of a new length each step: after the first call (which starts λ)
    and one length change (from which dynamo treats n as symbolic) no length compiles again; before,
    the one-row lane's settings cache guarded on n and compiled every new length until the limit."""
    torch._dynamo.reset()
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    loss = cls(k=0.1)
    compiled = torch.compile(loss, fullgraph=True, backend=backend)
    for n in (1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 5500):
        compiled(torch.rand(n, requires_grad=True)).backward()
    assert len(graphs) <= 3, len(graphs)
