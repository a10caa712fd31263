"""Decoding a translation from a :class:`~topklab.models.Transformer`: greedy search (cheap, for
validation) and fairseq-style batched beam search with a length penalty. Both decode step by step
with cached keys and values and return each sentence's best hypothesis (ids ending in eos,
right-padded to ``width``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from topklab.data.translation.vocab import BOS, EOS, PAD
from topklab.utils.checks import check_int


def _max_length(source: torch.Tensor, max_len_a: float, max_len_b: int, width: int) -> int:
    """Tokens before eos a hypothesis may have: a·(padded source length) + b (fairseq's rule), at
    most ``width`` − 1 so that eos fits."""
    return max(0, min(int(max_len_a * source.shape[1] + max_len_b), width - 1))


def _step_log_probs(model, tokens, memory, mask, cache, step: int, limit: int, min_len: int) -> torch.Tensor:
    logits = model.decode(tokens[:, -1:], memory, mask, cache, position=step)[:, -1]
    log_probs = F.log_softmax(logits.float(), dim=-1)
    log_probs[:, PAD] = log_probs[:, BOS] = -float("inf")
    if step == limit:  # the length limit forces eos
        log_probs[:, :EOS] = log_probs[:, EOS + 1 :] = -float("inf")
    elif step < min_len:
        log_probs[:, EOS] = -float("inf")
    return log_probs


class GreedySearch:
    """The most probable next token at each step, until eos or the length limit.

    Parameters
    ----------
    max_len_a, max_len_b : a hypothesis has at most a·(source length) + b tokens before eos, the
        source length being the batch's padded width (fairseq's ``--max-len-a/-b``; defaults 0, 200)
    min_len : int >= 0, eos is not allowed before this many tokens (fairseq's default 1: no empty output)
    """

    def __init__(self, max_len_a: float = 0.0, max_len_b: int = 200, min_len: int = 1):
        self.max_len_a, self.max_len_b, self.min_len = max_len_a, max_len_b, min_len

    @torch.no_grad()
    def __call__(self, model, source: torch.Tensor, width: int) -> torch.Tensor:
        memory, mask = model.encode(source)
        limit = _max_length(source, self.max_len_a, self.max_len_b, width)
        tokens = torch.full((len(source), 1), BOS, dtype=torch.int64, device=source.device)
        finished = torch.zeros(len(source), dtype=torch.bool, device=source.device)
        cache = model.new_cache()
        for step in range(limit + 1):
            next_token = _step_log_probs(model, tokens, memory, mask, cache, step, limit, self.min_len).argmax(-1)
            next_token = next_token.masked_fill(finished, PAD)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            finished |= next_token == EOS
            if bool(finished.all()):
                break
        return F.pad(tokens[:, 1:], (0, width - tokens.shape[1] + 1), value=PAD)


class BeamSearch:
    """Batched beam search as fairseq's ``SequenceGenerator`` does it.

    At each step the 2·beam best continuations of every sentence are ranked; those among the first
    ``beam`` that end in eos are finished with score ``log p(y) / |y|^length_penalty`` (|y| counts
    eos), the best ``beam`` others go on. A sentence is done once it has ``beam`` finished
    hypotheses (or at the length limit, where eos is forced); its answer is the best finished one.
    eos is blocked before ``min_len`` tokens.
    Done sentences leave the batch.

    Parameters
    ----------
    beam : int >= 1, hypotheses kept per sentence (5 in the paper's recipes)
    length_penalty : float, exponent of the length normalisation (> 0 favours longer output,
        0 ranks by total log-probability; fairseq's default 1.0)
    max_len_a, max_len_b, min_len : as :class:`GreedySearch`
    """

    def __init__(
        self, beam: int = 5, length_penalty: float = 1.0, max_len_a: float = 0.0, max_len_b: int = 200, min_len: int = 1
    ):
        check_int("search.beam", beam)
        self.beam, self.length_penalty = beam, length_penalty
        self.max_len_a, self.max_len_b, self.min_len = max_len_a, max_len_b, min_len

    @torch.no_grad()
    def __call__(self, model, source: torch.Tensor, width: int) -> torch.Tensor:
        batch, beam, device = len(source), self.beam, source.device
        limit = _max_length(source, self.max_len_a, self.max_len_b, width)
        memory, mask = model.encode(source)
        expand = torch.arange(batch, device=device).repeat_interleave(beam)
        memory, mask = memory.index_select(0, expand), mask.index_select(0, expand)
        cache = model.new_cache()
        tokens = torch.full((batch * beam, 1), BOS, dtype=torch.int64, device=device)
        scores = torch.full((batch, beam), -float("inf"), dtype=torch.float64, device=device)
        scores[:, 0] = 0.0  # one live hypothesis per sentence at the start
        finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
        alive = list(range(batch))  # row i of the working tensors belongs to sentence alive[i]
        for step in range(limit + 1):
            log_probs = _step_log_probs(model, tokens, memory, mask, cache, step, limit, self.min_len)
            vocab = log_probs.shape[-1]
            candidates = (scores.view(-1, 1) + log_probs.double()).view(len(alive), beam * vocab)
            top_scores, top_index = candidates.topk(min(2 * beam, beam * vocab), dim=1)
            origin, token = top_index // vocab, top_index % vocab
            ends = (token == EOS) | ~torch.isfinite(top_scores)
            normaliser = float(step + 1) ** self.length_penalty
            for row, rank in ((token[:, :beam] == EOS) & torch.isfinite(top_scores[:, :beam])).nonzero().tolist():
                sentence = alive[row]
                if len(finished[sentence]) < beam:
                    hypothesis = tokens[row * beam + origin[row, rank], 1:].tolist() + [EOS]
                    finished[sentence].append((float(top_scores[row, rank]) / normaliser, hypothesis))
            keep = [row for row, sentence in enumerate(alive) if len(finished[sentence]) < beam]
            if not keep or step == limit:
                break
            rank = torch.argsort(ends.to(torch.int8), dim=1, stable=True)[:, :beam]  # the best non-ending ones
            keep_rows = torch.tensor(keep, device=device)
            rank, top_scores, origin, token = (t.index_select(0, keep_rows) for t in (rank, top_scores, origin, token))
            chosen_origin, chosen_token = origin.gather(1, rank), token.gather(1, rank)
            # fewer than `beam` live continuations (tiny vocabularies): the rest are dead, not finished ones going on
            scores = top_scores.gather(1, rank).masked_fill(
                ends.index_select(0, keep_rows).gather(1, rank), -float("inf")
            )
            order = (keep_rows[:, None] * beam + chosen_origin).view(-1)
            tokens = torch.cat([tokens.index_select(0, order), chosen_token.view(-1, 1)], dim=1)
            if len(keep) < len(alive):
                rows = (keep_rows[:, None] * beam + torch.arange(beam, device=device)).view(-1)
                memory, mask = memory.index_select(0, rows), mask.index_select(0, rows)
            model.reorder_cache(cache, order)
            alive = [alive[row] for row in keep]
        out = torch.full((batch, width), PAD, dtype=torch.int64, device=device)
        for sentence, hypotheses in enumerate(finished):
            best = max(hypotheses, key=lambda h: h[0])[1]  # ties keep the earlier-finished hypothesis
            out[sentence, : len(best)] = torch.tensor(best, device=device)
        return out
