"""One language of a parallel corpus as language-modelling text (e.g. the English side of Multi30k)."""

from __future__ import annotations

from topklab.data.translation.corpora import SPLITS, ParallelTextFiles
from topklab.data.translation.splits import TranslationSplits
from topklab.data.translation.vocab import SubwordVocab


class MonolingualText(ParallelTextFiles):
    """``<root>/<file stem>.<language>`` sentences for a language model, with a sentencepiece
    vocabulary learned on the training sentences of that language.

    Batches are the translation loaders' with an empty source: ``x.decoder_input`` is bos + the
    sentence, ``y`` the sentence + eos, and the token budget counts target tokens. Parameters as
    :class:`~topklab.data.translation.ParallelTextFiles`, with ``language`` in place of ``pair``.

    Examples
    --------
    ``dataset=multi30k_en`` reads ``../shared/data/multi30k/{train,val,test}.en``.
    """

    def __init__(
        self,
        root: str,
        name: str,
        language: str = "en",
        files: dict | None = None,
        bpe_marker: str | None = None,
        **kwargs,
    ):
        super().__init__(
            root=root, name=name, files=files, bpe_marker=bpe_marker, pair=f"{language}-{language}", **kwargs
        )
        self.language = language

    def splits(self) -> TranslationSplits:
        lines = {split: target for split, (_, target) in self.read().items()}
        vocab = SubwordVocab.learn([lines["train"]], cache_dir=self.vocab_dir, **self.vocab_options)
        encoded = {split: vocab.encode_lines(lines[split]) for split in SPLITS}
        dropped = sum(len(ids) > self.max_length for ids in encoded["train"])
        encoded["train"] = [ids for ids in encoded["train"] if len(ids) <= self.max_length]
        info = {
            "language": self.language,
            "split_seed": self.split_seed,
            "vocab_size": len(vocab),
            "vocab_fingerprint": vocab.model_file.parent.name,
            "max_length": self.max_length,
            "dropped_train_sentences": dropped,
            "batch_multiple": self.batch_multiple,
            "sizes": {split: len(encoded[split]) for split in SPLITS},
            "tokens": {split: sum(map(len, encoded[split])) for split in SPLITS},
        }
        no_source = [[]]
        return TranslationSplits(
            self.name,
            vocab,
            {split: (no_source * len(ids), ids) for split, ids in encoded.items()},
            {split: lines[split] for split in ("val", "test")},
            info,
            task="language_modeling",
            batch_multiple=self.batch_multiple,
        )
