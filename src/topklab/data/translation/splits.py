"""What a translation corpus hands the engine: encoded pairs per split, the vocabulary, and the
reference sentences the task scores translations against."""

from __future__ import annotations

from dataclasses import dataclass, field

from topklab.data.translation.batching import SentenceLoader, TokenBucketLoader
from topklab.data.translation.vocab import PAD, SubwordVocab


@dataclass
class TranslationSplits:
    """Encoded ``(sources, targets)`` id lists per split (each sentence ending in eos), the raw
    target text of val and test (the references), ``info`` for the summary, ``indices`` (a
    held-out validation split's training indices) for the run's ``indices.json``, and
    ``batch_multiple``, the sentence multiple of a full training batch.

    The engine's ``batch_size`` is a token budget here (fairseq's ``--max-tokens``), and its
    ``eval_batch_size`` a number of sentences.
    """

    name: str
    vocab: SubwordVocab
    encoded: dict
    references: dict
    info: dict = field(default_factory=dict)
    indices: dict = field(default_factory=dict)
    task: str = "translation"
    batch_multiple: int = 8

    def provides(self) -> dict:
        """What models, losses and the task may ask of the data (by constructor argument name)."""
        return {"vocab_size": len(self.vocab), "pad_id": PAD, "vocab": self.vocab}

    def targets(self, split: str) -> list[str]:
        """Reference sentences (val, test); the training split's target ids."""
        return self.references[split] if split in self.references else self.encoded[split][1]

    def train_loader(self, batch_size: int, drop_last: bool, seed: int, device, channels_last: bool = False):
        """Token-bucketed, shuffled batches of at most ``batch_size`` padded tokens (drop_last has no
        meaning here: every batch is full up to the budget)."""
        sources, targets = self.encoded["train"]
        return TokenBucketLoader(sources, targets, batch_size, seed, device, self.batch_multiple)

    def eval_loader(self, split: str, batch_size: int | None, device, channels_last: bool = False):
        sources, targets = self.encoded[split]
        return SentenceLoader(sources, targets, batch_size, device)

    def smallest_batch(self, batch_size: int, drop_last: bool) -> int:
        """Per-token losses in the training batch that has the fewest (what a count k must fit)."""
        return self.train_loader(batch_size, drop_last, 0, "cpu").smallest_target_tokens()
