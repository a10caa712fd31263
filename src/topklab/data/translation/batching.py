"""Sentence pairs as padded id tensors, grouped into token-bucketed batches.

Training batches follow fairseq's ``--max-tokens`` (``batch_by_size``): pairs are ordered by source
length, then target length, ties in a seeded random order, and cut greedily so that a batch's padded
size, sentences × its longest side, stays within ``max_tokens``; a full batch keeps a multiple of
``batch_multiple`` sentences and hands the rest on to the next (fairseq's
``--required-batch-size-multiple``, 8). The batches are fixed for a run (so an epoch always
has the same number of steps) and visited in a new order each epoch, drawn from (seed, epoch)
alone, so any epoch can be replayed or resumed at any batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from topklab.data.translation.vocab import BOS, PAD
from topklab.data.vision.loaders import epoch_seed
from topklab.utils.checks import check_int
from topklab.utils.errors import TopklabError


@dataclass
class PairBatch:
    """A model input: source ids (B, S) and the decoder's input (B, T) — the target shifted right
    behind bos. Sliceable along sentences, like a tensor, so the engine can shard it."""

    source: torch.Tensor
    decoder_input: torch.Tensor

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index) -> PairBatch:
        return PairBatch(self.source[index], self.decoder_input[index])

    def to(self, device) -> PairBatch:
        return PairBatch(self.source.to(device, non_blocking=True), self.decoder_input.to(device, non_blocking=True))


def pad_rows(rows: list[list[int]], width: int | None = None) -> torch.Tensor:
    """Rows of ids right-padded with pad into one int64 tensor (len(rows), width or longest)."""
    width = width or max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD, dtype=torch.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.int64)
    return out


def collate(sources: list[list[int]], targets: list[list[int]]) -> tuple[PairBatch, torch.Tensor]:
    """(PairBatch(source, bos + target[:-1]), target), each right-padded; targets end in eos."""
    target = pad_rows(targets)
    decoder_input = pad_rows([[BOS] + t[:-1] for t in targets], target.shape[1])
    return PairBatch(pad_rows(sources), decoder_input), target


def token_batches(
    source_lengths: list[int], target_lengths: list[int], max_tokens: int, seed: int, batch_multiple: int = 1
) -> list[list[int]]:
    """Indices of pairs grouped by length so that len(batch) × max(src, tgt length) <= max_tokens."""
    n = len(source_lengths)
    sizes = torch.tensor([max(s, t) for s, t in zip(source_lengths, target_lengths)], dtype=torch.int64)
    longest = int(sizes.max()) if n else 0
    if longest > max_tokens:
        raise TopklabError(
            f"max tokens per batch ({max_tokens}) is smaller than the longest sentence pair ({longest} tokens); "
            f"raise engine.batch_size (the token budget) or lower dataset.max_length"
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    order = order[torch.argsort(torch.tensor(target_lengths)[order], stable=True)]
    order = order[torch.argsort(torch.tensor(source_lengths)[order], stable=True)]
    sizes = sizes.tolist()
    batches, current, width = [], [], 0
    for index in order.tolist():
        if current and (len(current) + 1) * max(width, sizes[index]) > max_tokens:
            keep = max(batch_multiple * (len(current) // batch_multiple), len(current) % batch_multiple)
            batches.append(current[:keep])
            current = current[keep:]
            width = max((sizes[i] for i in current), default=0)
        current.append(index)
        width = max(width, sizes[index])
    if current:
        batches.append(current)
    return batches


class TokenBucketLoader:
    """Training batches of sentence pairs by token budget (see the module docstring).

    Parameters
    ----------
    sources, targets : id lists per pair (each ending in eos)
    max_tokens : int >= the longest pair, padded tokens per batch
    seed : int, with the epoch number, the only source of randomness
    batch_multiple : int >= 1, sentences per full batch are a multiple of this
    device : where batches are returned

    Examples
    --------
    >>> loader = TokenBucketLoader([[5, 3], [6, 7, 3], [5, 3]], [[8, 3], [9, 3], [8, 8, 8, 3]], max_tokens=8)
    >>> loader.fixed_batches  # source length first: pairs 0 and 2 (2 source tokens) share a batch, 2 × 4 <= 8
    [[0, 2], [1]]
    >>> len(loader), sorted(len(y) for _, y in loader.batches(epoch=0))
    (2, [1, 2])
    """

    def __init__(
        self,
        sources: list[list[int]],
        targets: list[list[int]],
        max_tokens: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
        batch_multiple: int = 1,
    ):
        check_int("max tokens per batch", max_tokens, error=TopklabError)
        self.sources, self.targets, self.seed = sources, targets, seed
        self.device = torch.device(device)
        check_int("dataset.batch_multiple", batch_multiple, error=TopklabError)
        self.fixed_batches = token_batches(
            [len(s) for s in sources], [len(t) for t in targets], max_tokens, seed, batch_multiple
        )

    def __len__(self) -> int:
        return len(self.fixed_batches)

    def smallest_target_tokens(self) -> int:
        """Non-pad target tokens in the batch that has the fewest (the count k must fit)."""
        return min(sum(len(self.targets[i]) for i in batch) for batch in self.fixed_batches)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[tuple[PairBatch, torch.Tensor]]:
        visit = torch.randperm(len(self), generator=torch.Generator().manual_seed(epoch_seed(self.seed, epoch)))
        for b in visit[start:].tolist():
            indices = self.fixed_batches[b]
            x, y = collate([self.sources[i] for i in indices], [self.targets[i] for i in indices])
            yield x.to(self.device), y.to(self.device)


class SentenceLoader:
    """Evaluation batches: the split in its stored order, ``batch_size`` sentences at a time."""

    def __init__(
        self,
        sources: list[list[int]],
        targets: list[list[int]],
        batch_size: int | None,
        device: str | torch.device = "cpu",
    ):
        self.sources, self.targets = sources, targets
        self.batch_size = batch_size or len(sources)
        self.device = torch.device(device)

    def __len__(self) -> int:
        return -(-len(self.sources) // self.batch_size)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[tuple[PairBatch, torch.Tensor]]:
        for b in range(start, len(self)):
            chunk = slice(b * self.batch_size, (b + 1) * self.batch_size)
            x, y = collate(self.sources[chunk], self.targets[chunk])
            yield x.to(self.device), y.to(self.device)
