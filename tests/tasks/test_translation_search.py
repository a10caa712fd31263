"""Decoding: incremental decoding equals full recomputation; beam search equals exhaustive search
when the beam holds every hypothesis; greedy equals beam 1."""

import itertools

import pytest
import torch

from topklab.data.translation.vocab import BOS, EOS, PAD
from topklab.models import Transformer
from topklab.tasks import BeamSearch, GreedySearch

VOCAB = 7  # pad, unk, bos, eos and three words


def tiny_model(seed=0, **kwargs) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(
        VOCAB, d_model=8, ffn_dim=16, heads=2, encoder_layers=2, decoder_layers=2, dropout=0.0, **kwargs
    )
    with torch.no_grad():  # sharper distributions than the initialisation gives, so hypotheses differ clearly
        model.target_embedding.weight.mul_(6.0)
    return model.eval().double()


def sequence_log_prob(model, source: torch.Tensor, hypothesis: list[int]) -> float:
    """log p(hypothesis | source) from one full teacher-forced pass (the slow, obvious way)."""
    memory, mask = model.encode(source[None])
    decoder_input = torch.tensor([[BOS] + hypothesis[:-1]])
    log_probs = torch.log_softmax(model.decode(decoder_input, memory, mask)[0], dim=-1)
    return float(sum(log_probs[t, token] for t, token in enumerate(hypothesis)).detach())


def exhaustive(model, source: torch.Tensor, max_words: int, length_penalty: float) -> list[int]:
    """The best hypothesis over every sequence of 1..max_words words followed by eos."""
    words = [t for t in range(VOCAB) if t not in (PAD, BOS, EOS)]
    best, best_score = None, -float("inf")
    for length in range(1, max_words + 1):
        for prefix in itertools.product(words, repeat=length):
            hypothesis = list(prefix) + [EOS]
            score = sequence_log_prob(model, source, hypothesis) / (length + 1) ** length_penalty
            if score > best_score:
                best, best_score = hypothesis, score
    return best


@pytest.mark.parametrize("pre_norm", [False, True])
def test_incremental_decoding_matches_full_recomputation(pre_norm):
    model = tiny_model(pre_norm=pre_norm)
    source = torch.tensor([[4, 5, 6, 3], [6, 4, 3, PAD]])
    prefix = torch.tensor([[BOS, 4, 6, 5, 4], [BOS, 5, 5, 6, 4]])
    memory, mask = model.encode(source)
    full = model.decode(prefix, memory, mask)
    cache = model.new_cache()
    steps = torch.cat(
        [model.decode(prefix[:, t : t + 1], memory, mask, cache, position=t) for t in range(prefix.shape[1])], dim=1
    )
    torch.testing.assert_close(steps, full, rtol=1e-10, atol=1e-10)


def test_reordered_cache_follows_the_chosen_rows():
    model = tiny_model()
    source = torch.tensor([[4, 5, 3], [6, 4, 3]])
    prefix = torch.tensor([[BOS, 4, 6], [BOS, 5, 5]])
    memory, mask = model.encode(source)
    cache = model.new_cache()
    for t in range(2):
        model.decode(prefix[:, t : t + 1], memory, mask, cache, position=t)
    order = torch.tensor([1, 1, 0])
    model.reorder_cache(cache, order)
    step = model.decode(prefix[order, 2:3], memory[order], mask[order], cache, position=2)
    torch.testing.assert_close(
        step, model.decode(prefix[order], memory[order], mask[order])[:, 2:3], rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_equals_exhaustive_search_with_a_beam_that_holds_everything(seed, length_penalty):
    model = tiny_model(seed)
    sources = torch.tensor([[4, 5, 6, 3], [6, 6, 3, PAD], [5, 3, PAD, PAD]])
    max_words = 3  # 3 + 9 + 27 = 39 hypotheses: a beam of 40 ranks every candidate among its first `beam`
    found = BeamSearch(beam=40, length_penalty=length_penalty, max_len_a=0, max_len_b=max_words)(
        model, sources, width=6
    )
    for row, source in enumerate(sources):
        expected = exhaustive(model, source[source != PAD], max_words, length_penalty)
        assert found[row].tolist() == expected + [PAD] * (6 - len(expected))


def test_beam_one_is_greedy_and_beams_differ_from_greedy_somewhere():
    model = tiny_model(3)
    torch.manual_seed(0)
    sources = torch.randint(4, VOCAB, (12, 5))
    greedy = GreedySearch(max_len_b=6)(model, sources, width=8)
    assert torch.equal(BeamSearch(beam=1, max_len_b=6)(model, sources, width=8), greedy)
    assert not torch.equal(BeamSearch(beam=4, max_len_b=6)(model, sources, width=8), greedy)


@pytest.mark.parametrize("min_len", [1, 3])
def test_every_hypothesis_ends_in_eos_within_the_length_limit(min_len):
    model = tiny_model(5)
    sources = torch.randint(4, VOCAB, (5, 3))
    for search in (
        GreedySearch(max_len_a=1.0, max_len_b=1, min_len=min_len),
        BeamSearch(beam=3, max_len_a=1.0, max_len_b=1, min_len=min_len),
    ):
        out = search(model, sources, width=10)
        assert out.shape == (5, 10)
        lengths = [row.index(EOS) for row in out.tolist()]  # words before eos: at most 1.0 × 3 + 1
        assert all(min_len <= n <= 4 for n in lengths), lengths  # for every min_len: eos neither early nor late
        assert max(lengths) == 4 or min_len == 1, lengths  # blocking eos for 3 words drives some to the limit
        for row, n in zip(out.tolist(), lengths):
            assert all(t == PAD for t in row[n + 1 :])


def test_the_length_limit_allows_that_many_words_then_eos():
    model = tiny_model(6)
    decode = model.decode

    def never_eos(*args, **kwargs):  # so that every hypothesis runs to the limit
        logits = decode(*args, **kwargs)
        logits[..., EOS] = -1e4
        return logits

    model.decode = never_eos
    sources = torch.randint(4, VOCAB, (4, 3))
    for search in (GreedySearch(max_len_b=5), BeamSearch(beam=2, max_len_b=5)):
        assert [row.index(EOS) for row in search(model, sources, width=8).tolist()] == [5] * 4
