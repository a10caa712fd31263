"""SoftATk: average-top-k through any operator's soft top-k indicator."""

import pytest
import torch

from topklab.losses import ATk, SoftATk
from topklab.operators import DiffSortNet, NeuralSort


def test_soft_atk_is_atk_with_a_hard_operator_and_interpolates_otherwise():
    losses = torch.tensor([0.3, 2.0, 1.1, 0.0, 4.0, 1.0], dtype=torch.float64)
    sharp = SoftATk(k=3, operator=DiffSortNet("bitonic", steepness=1e3, distribution="logistic"))
    assert sharp(losses).item() == pytest.approx(ATk(k=3)(losses).item(), abs=1e-9)
    soft = SoftATk(k=3, operator=DiffSortNet("bitonic", steepness=0.5, distribution="logistic"))
    assert losses.mean().item() < soft(losses).item() < ATk(k=3)(losses).item()


def test_soft_atk_gradcheck_float64():
    losses = torch.rand(7, dtype=torch.float64, requires_grad=True)
    aggregate = SoftATk(k=0.5, operator=NeuralSort(tau=0.3))
    assert torch.autograd.gradcheck(aggregate, (losses,))


def test_soft_atk_rows_with_different_k_equal_their_own_rows():
    losses = torch.rand(4, 9, dtype=torch.float64)
    k = torch.tensor([2.0, 5.0, 2.0, 9.0], dtype=torch.float64)
    aggregate = SoftATk(k=1, operator=DiffSortNet("odd_even", steepness=2.0, distribution="cauchy"))
    rows = aggregate.batched(losses, k, None, None)
    for i in range(4):
        alone = SoftATk(k=int(k[i]), operator=aggregate.operator)(losses[i])
        assert rows[i].item() == pytest.approx(alone.item(), abs=1e-12)


def test_soft_atk_refuses_a_non_operator():
    with pytest.raises(ValueError, match="needs a top-k operator"):
        SoftATk(k=2, operator=torch.nn.Identity())
