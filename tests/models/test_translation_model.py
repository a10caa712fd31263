"""The per-token label-smoothed loss against a slow reference (with a float64 gradcheck), and the
Transformer's padding, sharing and shape rules."""

import pytest
import torch
import torch.nn.functional as F

from topklab.data.translation import PairBatch
from topklab.losses import LabelSmoothedCrossEntropy
from topklab.models import Transformer


def slow_label_smoothed(logits, target, smoothing, pad):
    """Loop over tokens: the target gets 1 − ε, every other piece ε/(V−1), pad positions skipped."""
    out = []
    vocab = logits.shape[-1]
    for b in range(target.shape[0]):
        for t in range(target.shape[1]):
            if int(target[b, t]) == pad:
                continue
            log_p = torch.log_softmax(logits[b, t], dim=0)
            weights = torch.full((vocab,), smoothing / (vocab - 1), dtype=logits.dtype)
            weights[target[b, t]] = 1 - smoothing
            out.append(-(weights * log_p).sum())
    return torch.stack(out)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_matches_the_slow_reference(smoothing):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 9, dtype=torch.float64)
    target = torch.tensor([[4, 5, 3, 0, 0], [6, 3, 0, 0, 0], [7, 8, 4, 5, 3]])
    fast = LabelSmoothedCrossEntropy(smoothing, pad_id=0)(logits, target)
    assert fast.shape == (10,)
    torch.testing.assert_close(fast, slow_label_smoothed(logits, target, smoothing, 0).to(fast.dtype))


def test_label_smoothed_loss_gradcheck_float64():
    torch.manual_seed(1)
    target = torch.tensor([[4, 5, 3, 0], [6, 3, 0, 0]])
    logits = torch.randn(2, 4, 7, dtype=torch.float64, requires_grad=True)
    loss = LabelSmoothedCrossEntropy(0.1, pad_id=0)
    assert torch.autograd.gradcheck(lambda z: loss(z, target), (logits,))


def test_unsmoothed_loss_is_cross_entropy_of_the_real_tokens():
    torch.manual_seed(2)
    logits = torch.randn(2, 4, 6)
    target = torch.tensor([[4, 5, 3, 0], [2, 3, 0, 0]])
    keep = target != 0
    torch.testing.assert_close(
        LabelSmoothedCrossEntropy(0.0)(logits, target), F.cross_entropy(logits[keep], target[keep], reduction="none")
    )


def tiny(**kwargs):
    torch.manual_seed(0)
    return Transformer(
        13, d_model=8, ffn_dim=16, heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0, **kwargs
    ).eval()


@pytest.mark.parametrize("pre_norm", [False, True])
def test_padding_does_not_change_the_translation_model(pre_norm):
    model = tiny(pre_norm=pre_norm)
    short = PairBatch(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7, 8]]))
    padded = PairBatch(torch.tensor([[5, 6, 3, 0, 0]]), torch.tensor([[2, 7, 8, 0]]))
    torch.testing.assert_close(model(padded)[:, :3], model(short))


def test_logits_depend_only_on_earlier_target_positions():
    model = tiny()
    a = model(PairBatch(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7, 8, 9]])))
    b = model(PairBatch(torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7, 11, 12]])))
    torch.testing.assert_close(a[:, :2], b[:, :2])
    assert not torch.allclose(a[:, 2:], b[:, 2:])


def test_embedding_sharing():
    shared = tiny(share_all_embeddings=True)
    assert shared.source_embedding is shared.target_embedding and shared.output_projection is None
    separate = tiny(share_decoder_embeddings=False)
    assert separate.output_projection is not None and separate.source_embedding is not separate.target_embedding
    assert float(separate.target_embedding.weight[0].abs().sum()) == 0.0  # the pad row
    base = sum(p.numel() for p in tiny().parameters())
    assert sum(p.numel() for p in shared.parameters()) == base - 13 * 8


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"d_model": 9, "heads": 3}, "even"),
        ({"heads": 3}, "divisible"),
        ({"dropout": 1.0}, "dropout"),
        ({"encoder_layers": 0}, "layers"),
    ],
)
def test_bad_model_shapes_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Transformer(13, **{"d_model": 8, **kwargs})
