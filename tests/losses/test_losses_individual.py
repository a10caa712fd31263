import math

import pytest
import torch
import torch.nn.functional as F

from topklab.losses import Absolute, CrossEntropy, Hinge, Logistic, Square


def test_logistic_matches_formula_and_is_stable():
    f = torch.tensor([-3.0, 0.0, 2.5, 800.0, -800.0], dtype=torch.float64)
    y = torch.tensor([1.0, -1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    got = Logistic()(f, y)
    expected = [
        math.log1p(math.exp(-yi * fi)) if -yi * fi < 700 else -yi * fi for fi, yi in zip(f.tolist(), y.tolist())
    ]
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    assert torch.isfinite(got).all()


def test_hinge_square_absolute_match_formulas():
    f = torch.tensor([[0.3], [-2.0], [1.5]], dtype=torch.float64)  # (n, 1) outputs are accepted
    y = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    assert Hinge()(f, y).tolist() == pytest.approx([0.7, 3.0, 2.5])
    assert Square()(f, y).tolist() == pytest.approx([0.49, 9.0, 6.25])
    assert Absolute()(f, y).tolist() == pytest.approx([0.7, 3.0, 2.5])


def test_cross_entropy_is_per_sample_and_averages_to_torch():
    logits = torch.randn(8, 5, dtype=torch.float64)
    target = torch.randint(0, 5, (8,))
    per_sample = CrossEntropy()(logits, target)
    assert per_sample.shape == (8,)
    assert per_sample.mean().item() == pytest.approx(F.cross_entropy(logits, target).item(), rel=1e-12)


@pytest.mark.parametrize("cls", [Logistic, Square, Absolute])
def test_gradcheck_individual(cls):
    f = torch.randn(12, dtype=torch.float64, requires_grad=True)
    y = torch.where(torch.rand(12) > 0.5, 1.0, -1.0).double()
    assert torch.autograd.gradcheck(lambda out: cls()(out, y), (f,))


def test_rejects_multi_column_scores():
    with pytest.raises(ValueError, match="one score per sample"):
        Logistic()(torch.zeros(4, 2), torch.ones(4))
