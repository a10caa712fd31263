"""A joint subword vocabulary learned with sentencepiece (BPE by default) on the training text of
both languages, cached under a fingerprint of that text and the options, so every run on the same
corpus reuses one model file."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from topklab.utils.errors import DataUnavailableError, TopklabError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
MODEL_TYPES = ("bpe", "unigram")


def fingerprint(lines_per_language: list[list[str]], options: dict) -> str:
    """sha256 (first 16 hex digits) of the training text of every language and the options."""
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for lines in lines_per_language:
        digest.update(b"\x00language\x00")
        for line in lines:
            digest.update(line.encode("utf-8"))
            digest.update(b"\n")
    return digest.hexdigest()[:16]


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise DataUnavailableError(
            "sentencepiece is not installed; run `make setup` (or pip install sentencepiece==0.2.3)"
        ) from None
    return sentencepiece


class SubwordVocab:
    """Encode text to subword ids and decode them back to detokenised text.

    Ids 0-3 are pad, unk, bos and eos; sentences are encoded with a final eos.

    Parameters
    ----------
    model_file : path of a trained sentencepiece model

    Examples
    --------
    >>> vocab = SubwordVocab.learn([["ein Hund läuft"] * 50, ["a dog runs"] * 50], 40, "/tmp/topklab-doc-spm")
    >>> vocab.decode(vocab.encode("a dog runs"))
    'a dog runs'
    """

    def __init__(self, model_file: str | os.PathLike):
        self.model_file = Path(model_file)
        try:
            self._sp = _sentencepiece().SentencePieceProcessor(model_file=str(self.model_file))
        except (OSError, RuntimeError) as err:
            raise TopklabError(
                f"sentencepiece model {self.model_file} cannot be read ({' '.join(str(err).split())}); "
                f"delete it to learn it again"
            ) from None
        self.pad, self.unk, self.bos, self.eos = PAD, UNK, BOS, EOS

    def __len__(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, line: str) -> list[int]:
        """Subword ids of one sentence followed by eos."""
        return self._sp.encode(line) + [EOS]

    def encode_lines(self, lines: list[str]) -> list[list[int]]:
        return [ids + [EOS] for ids in self._sp.encode(list(lines))]

    def decode(self, ids) -> str:
        """Text of ids, cut at the first eos, pad/bos dropped."""
        ids = [int(i) for i in ids]
        if EOS in ids:
            ids = ids[: ids.index(EOS)]
        return self._sp.decode([i for i in ids if i not in (PAD, BOS)])

    def pieces(self, ids) -> list[str]:
        return [self._sp.id_to_piece(int(i)) for i in ids]

    @classmethod
    def learn(
        cls,
        lines_per_language: list[list[str]],
        vocab_size: int,
        cache_dir: str | os.PathLike,
        model_type: str = "bpe",
        character_coverage: float = 1.0,
        max_sentences: int = 0,
    ) -> SubwordVocab:
        """Learn (or load from ``cache_dir/<fingerprint>/spm.model``) a joint vocabulary.

        Parameters
        ----------
        lines_per_language : the training sentences of each language (a joint vocabulary)
        vocab_size : int > 4, subword pieces including the four specials
        cache_dir : where models are cached, one folder per fingerprint
        model_type : bpe | unigram
        character_coverage : float in (0, 1], characters covered (1.0 for European languages)
        max_sentences : int >= 0, learn from a seeded sample of this many sentences (0: all)
        """
        if model_type not in MODEL_TYPES:
            raise TopklabError(f"dataset.spm_model_type={model_type!r}; choose one of {', '.join(MODEL_TYPES)}")
        if not isinstance(vocab_size, int) or vocab_size <= 4:
            raise TopklabError(f"dataset.vocab_size={vocab_size!r} must be an int > 4")
        if not 0 < character_coverage <= 1:
            raise TopklabError(f"dataset.character_coverage={character_coverage} must lie in (0, 1]")
        options = {
            "vocab_size": vocab_size,
            "model_type": model_type,
            "character_coverage": character_coverage,
            "max_sentences": max_sentences,
            "format": 1,
        }
        folder = Path(cache_dir) / fingerprint(lines_per_language, options)
        model_file = folder / "spm.model"
        if model_file.exists():
            return cls(model_file)
        folder.mkdir(parents=True, exist_ok=True)
        spm = _sentencepiece()
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            text = Path(tmp) / "train.txt"
            text.write_text(
                "".join(line + "\n" for lines in lines_per_language for line in lines if line.strip()), encoding="utf-8"
            )
            try:
                spm.SentencePieceTrainer.train(
                    input=str(text),
                    model_prefix=str(Path(tmp) / "spm"),
                    vocab_size=vocab_size,
                    model_type=model_type,
                    character_coverage=character_coverage,
                    pad_id=PAD,
                    unk_id=UNK,
                    bos_id=BOS,
                    eos_id=EOS,
                    input_sentence_size=max_sentences,
                    shuffle_input_sentence=True,
                    seed_sentencepiece_size=1000000,
                    num_threads=1,
                    minloglevel=2,
                    hard_vocab_limit=True,
                )
            except RuntimeError as err:
                raise TopklabError(
                    f"sentencepiece could not learn {vocab_size} pieces from this corpus "
                    f"({' '.join(str(err).split())[:200]}); lower dataset.vocab_size"
                ) from None
            (Path(tmp) / "spm.vocab").unlink(missing_ok=True)
            os.replace(Path(tmp) / "spm.model", model_file)  # atomic: concurrent jobs see a whole file or none
        (folder / "options.json").write_text(json.dumps(options, sort_keys=True) + "\n")
        return cls(model_file)
