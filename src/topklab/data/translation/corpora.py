"""Parallel corpora: text files per split and language (Multi30k, fairseq's IWSLT14 layout) and
Hugging Face ``datasets`` (IWSLT2017, WMT17), all tokenised by one joint subword vocabulary."""

from __future__ import annotations

from pathlib import Path

import torch

from topklab.data.translation.splits import TranslationSplits
from topklab.data.translation.vocab import SubwordVocab
from topklab.utils.checks import check_int
from topklab.utils.errors import DataUnavailableError, TopklabError

SPLITS = ("train", "val", "test")


def read_lines(path: Path) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().split("\n")[:-1] if path.stat().st_size else []
    except UnicodeDecodeError as err:
        raise TopklabError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); re-encode it as UTF-8"
        ) from None


def read_parallel(source_path: Path, target_path: Path) -> tuple[list[str], list[str]]:
    """The aligned lines of two files; a missing file or a length mismatch is a one-line error."""
    for path in (source_path, target_path):
        if not path.is_file():
            raise DataUnavailableError(
                f"parallel corpus file {path} not found; see the dataset config for where it comes from"
            )
    source, target = read_lines(source_path), read_lines(target_path)
    if len(source) != len(target):
        raise TopklabError(
            f"{source_path} has {len(source)} lines but {target_path} has {len(target)}; "
            f"the two sides of a parallel corpus must be aligned line by line"
        )
    if not source:
        raise TopklabError(f"{source_path} is empty")
    return source, target


def parse_pair(pair: str) -> tuple[str, str]:
    parts = str(pair).split("-")
    if len(parts) != 2 or not all(parts):
        raise TopklabError(f"dataset.pair={pair!r}; write it as <source>-<target>, e.g. de-en")
    return parts[0], parts[1]


class TranslationCorpus:
    """Base of every parallel corpus: read the three splits, learn or load the joint vocabulary,
    encode, drop over-long training pairs, hand out :class:`TranslationSplits`.

    Parameters
    ----------
    pair : <source>-<target> language codes, e.g. de-en
    vocab_size : int > 4, joint subword pieces (sentencepiece)
    spm_model_type : bpe | unigram
    character_coverage : float in (0, 1]
    spm_max_sentences : int >= 0, learn the vocabulary from at most this many sentences (0: all)
    vocab_dir : where learned vocabularies are cached, by training-text fingerprint
    max_length : int >= 2, training pairs with a longer side (in subwords, with eos) are dropped;
        validation and test pairs are always kept
    task : translation (recipes key on it)
    split_seed : int, seed of a validation hold-out from the training pairs (where one is used)
    batch_multiple : int >= 1, a full training batch holds a multiple of this many sentences
        (fairseq's ``--required-batch-size-multiple``, 8)
    """

    name = "translation"

    def __init__(
        self,
        pair: str = "de-en",
        vocab_size: int = 10000,
        spm_model_type: str = "bpe",
        character_coverage: float = 1.0,
        spm_max_sentences: int = 0,
        vocab_dir: str = ".data/spm",
        max_length: int = 256,
        task: str = "translation",
        split_seed: int = 0,
        batch_multiple: int = 8,
    ):
        self.source_lang, self.target_lang = parse_pair(pair)
        check_int("dataset.max_length", max_length, 2)
        self.pair = f"{self.source_lang}-{self.target_lang}"
        self.vocab_options = {
            "vocab_size": vocab_size,
            "model_type": spm_model_type,
            "character_coverage": character_coverage,
            "max_sentences": spm_max_sentences,
        }
        check_int("dataset.batch_multiple", batch_multiple)
        self.vocab_dir, self.max_length, self.task, self.split_seed = vocab_dir, max_length, task, split_seed
        self.batch_multiple = batch_multiple

    def read(self) -> dict[str, tuple[list[str], list[str]]]:
        """{split: (source lines, target lines)} for train, val and test."""
        raise NotImplementedError

    def splits(self) -> TranslationSplits:
        text = self.read()
        vocab = SubwordVocab.learn([text["train"][0], text["train"][1]], cache_dir=self.vocab_dir, **self.vocab_options)
        encoded = {split: (vocab.encode_lines(src), vocab.encode_lines(tgt)) for split, (src, tgt) in text.items()}
        sources, targets = encoded["train"]
        kept = [
            i
            for i, (s, t) in enumerate(zip(sources, targets))
            if len(s) <= self.max_length and len(t) <= self.max_length
        ]
        encoded["train"] = ([sources[i] for i in kept], [targets[i] for i in kept])
        info = {
            "pair": self.pair,
            "split_seed": self.split_seed,
            "vocab_size": len(vocab),
            "vocab_fingerprint": vocab.model_file.parent.name,
            "max_length": self.max_length,
            "dropped_train_pairs": len(sources) - len(kept),
            "sizes": {split: len(encoded[split][0]) for split in SPLITS},
            "target_tokens": {split: sum(map(len, encoded[split][1])) for split in SPLITS},
            "source_tokens": {split: sum(map(len, encoded[split][0])) for split in SPLITS},
        }
        references = {split: text[split][1] for split in ("val", "test")}
        info["batch_multiple"] = self.batch_multiple
        return TranslationSplits(
            self.name,
            vocab,
            encoded,
            references,
            info,
            getattr(self, "indices", {}),
            batch_multiple=self.batch_multiple,
        )


class ParallelTextFiles(TranslationCorpus):
    """``<root>/<file stem>.<lang>`` text files, one sentence per line, aligned across languages.

    Parameters (besides :class:`TranslationCorpus`'s)
    ----------
    root : folder holding the files
    name : the corpus's name in results
    files : {train, val, test} → file stem, e.g. {train: train, val: valid, test: test}
    bpe_marker : str or null, a subword joiner to undo before our own vocabulary is learned
        (fairseq's prepare-iwslt14.sh writes ``"@@ "``); null reads the text as it is

    Examples
    --------
    Multi30k (``dataset=multi30k``) is ``train|val|test.{de,en}``; fairseq's IWSLT14 preparation
    (``dataset=iwslt14``) writes ``train|valid|test.{de,en}`` with ``@@ `` joiners.
    """

    def __init__(self, root: str, name: str, files: dict | None = None, bpe_marker: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.root, self.name = Path(root), name
        self.files = {"train": "train", "val": "val", "test": "test", **(files or {})}
        if set(self.files) != set(SPLITS):
            raise ValueError(f"dataset.files needs exactly the keys train, val, test, got {sorted(self.files)}")
        self.bpe_marker = bpe_marker

    def languages(self) -> list[str]:
        return sorted(p.suffix[1:] for p in self.root.glob(f"{self.files['train']}.*") if p.suffix)

    def data_files(self) -> dict[str, Path]:
        """The text files it reads, ``{<split>.<language>: path}`` (:mod:`topklab.data.fingerprint`)."""
        self._check_pair()
        languages = dict.fromkeys((self.source_lang, self.target_lang))
        return {
            f"{split}.{lang}": self.root / f"{stem}.{lang}" for split, stem in self.files.items() for lang in languages
        }

    def _check_pair(self) -> None:
        if not self.root.is_dir():
            raise DataUnavailableError(
                f"dataset {self.name}: folder {self.root} not found; set dataset.root to the "
                f"folder holding {self.files['train']}.{self.source_lang} and its siblings"
            )
        missing = [
            lang
            for lang in (self.source_lang, self.target_lang)
            if not (self.root / f"{self.files['train']}.{lang}").is_file()
        ]
        if missing and self.languages():
            raise TopklabError(
                f"dataset {self.name}: no {self.files['train']}.{missing[0]} under {self.root}; the language pair "
                f"{self.pair} is not in this corpus (it has {', '.join(self.languages())})"
            )

    def read(self):
        self._check_pair()
        text = {}
        for split, stem in self.files.items():
            source, target = read_parallel(
                self.root / f"{stem}.{self.source_lang}", self.root / f"{stem}.{self.target_lang}"
            )
            if self.bpe_marker:
                source = [line.replace(self.bpe_marker, "") for line in source]
                target = [line.replace(self.bpe_marker, "") for line in target]
            text[split] = (source, target)
        return text


class HubParallel(TranslationCorpus):
    """A parallel corpus from the Hugging Face hub through ``datasets`` (rows
    ``{"translation": {lang: text}}``), read from a local ``save_to_disk`` copy at ``root`` when
    there is one, else from the ``datasets`` cache (offline: ``HF_DATASETS_OFFLINE=1``).

    Parameters (besides :class:`TranslationCorpus`'s)
    ----------
    path : hub dataset id, e.g. wmt/wmt17
    config_name : the dataset's configuration for the pair, e.g. de-en ("{pair}" is filled in)
    pairs : the language pairs the dataset has (an unknown one is refused before any download)
    root : folder of a ``DatasetDict.save_to_disk`` copy (used when it exists)
    hub_splits : {train, val, test} → the dataset's split names; a val of null holds out
        ``val_holdout`` training pairs (seeded by ``split_seed``)
    val_holdout : int >= 0, training pairs held out for validation when hub_splits.val is null
    cache_dir : the ``datasets`` cache
    """

    def __init__(
        self,
        path: str,
        config_name: str,
        pairs: list[str],
        root: str,
        name: str,
        hub_splits: dict | None = None,
        val_holdout: int = 0,
        cache_dir: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if self.pair not in pairs:
            raise TopklabError(f"dataset {name}: unknown language pair {self.pair}; choose one of {', '.join(pairs)}")
        self.path, self.config_name = path, config_name.format(pair=self.pair)
        self.root, self.name, self.cache_dir = Path(root), name, cache_dir
        self.hub_splits = {"train": "train", "val": "validation", "test": "test", **(hub_splits or {})}
        if self.hub_splits["val"] is None and val_holdout < 1:
            raise ValueError("dataset.val_holdout must be >= 1 when hub_splits.val is null")
        self.val_holdout = val_holdout
        self.indices = {}

    def _load(self):
        try:
            import datasets
        except ImportError:
            raise DataUnavailableError("the datasets package is not installed; run `make setup`") from None
        if (self.root / "dataset_dict.json").is_file():
            return datasets.load_from_disk(str(self.root))
        try:
            return datasets.load_dataset(self.path, self.config_name, cache_dir=self.cache_dir)
        except Exception as err:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError ...)
            raise DataUnavailableError(
                f"dataset {self.name}: {self.path} ({self.config_name}) is neither saved at {self.root} nor in the datasets "
                f'cache ({type(err).__name__}); on a machine with internet run python -c "import datasets; '
                f"datasets.load_dataset('{self.path}', '{self.config_name}').save_to_disk('{self.root}')\" "
                f"and copy {self.root} here"
            ) from None

    def data_files(self) -> dict[str, Path]:
        """The Arrow files of the splits it reads, ``{<hub split>/<file name>: path}``, from the saved copy
        or the ``datasets`` cache (:mod:`topklab.data.fingerprint`)."""
        loaded = self._load()
        used = [name for name in dict.fromkeys(self.hub_splits.values()) if name is not None and name in loaded]
        return {
            f"{name}/{Path(cached['filename']).name}": Path(cached["filename"])
            for name in used
            for cached in loaded[name].cache_files
        }

    def read(self):
        loaded = self._load()
        text = {}
        for split, hub_name in self.hub_splits.items():
            if hub_name is None:
                continue
            if hub_name not in loaded:
                raise TopklabError(
                    f"dataset {self.name}: split {hub_name!r} not in {self.path} (it has {', '.join(loaded)})"
                )
            rows = loaded[hub_name]["translation"]
            try:
                text[split] = ([r[self.source_lang] for r in rows], [r[self.target_lang] for r in rows])
            except KeyError as err:
                raise TopklabError(
                    f"dataset {self.name}: rows of split {hub_name!r} have no {err.args[0]!r} side; "
                    f"the pair {self.pair} does not match this copy"
                ) from None
        if self.hub_splits["val"] is None:
            source, target = text["train"]
            if self.val_holdout >= len(source):
                raise TopklabError(
                    f"dataset.val_holdout={self.val_holdout} leaves no training pairs (train has {len(source)})"
                )
            order = torch.randperm(len(source), generator=torch.Generator().manual_seed(self.split_seed)).tolist()
            val, train = sorted(order[: self.val_holdout]), sorted(order[self.val_holdout :])
            text["val"] = ([source[i] for i in val], [target[i] for i in val])
            text["train"] = ([source[i] for i in train], [target[i] for i in train])
            self.indices = {"val": val}
        return text
