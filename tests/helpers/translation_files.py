"""Tiny parallel corpora written in the real on-disk formats: fairseq's IWSLT14 layout (text files
with "@@ " joiners), plain text files (Multi30k's layout) and a ``datasets`` ``save_to_disk`` copy."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = {
    "hund": "dog",
    "katze": "cat",
    "mann": "man",
    "frau": "woman",
    "kind": "child",
    "läuft": "runs",
    "springt": "jumps",
    "schläft": "sleeps",
    "rot": "red",
    "blau": "blue",
    "groß": "big",
    "klein": "small",
    "auf": "on",
    "im": "in the",
    "garten": "garden",
    "straße": "street",
    "wasser": "water",
    "ball": "ball",
}


def sentence_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """German-like / English-like pairs: a word-by-word dictionary translation of 2-7 words."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = rng.choices(list(WORDS), k=rng.randint(2, 7))
        pairs.append((" ".join(words) + " .", " ".join(WORDS[w] for w in words) + " ."))
    return pairs


def write_text_corpus(
    root: Path, stems=("train", "val", "test"), sizes=(240, 24, 20), bpe_marker: str | None = None, pair=("de", "en")
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for seed, (stem, n) in enumerate(zip(stems, sizes)):
        pairs = sentence_pairs(n, seed)
        for side, lang in enumerate(pair):
            lines = [p[side] for p in pairs]
            if bpe_marker:  # fairseq's subword-nmt output: "hund" -> "hu@@ nd"
                lines = [
                    " ".join(f"{w[:2]}{bpe_marker}{w[2:]}" if len(w) > 3 else w for w in line.split()) for line in lines
                ]
            (root / f"{stem}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return root


def write_hub_copy(root: Path, splits=("train", "validation", "test"), sizes=(240, 24, 20), pair=("de", "en")) -> Path:
    """A ``DatasetDict.save_to_disk`` folder with rows {"translation": {de: ..., en: ...}} (wmt17's shape)."""
    import datasets

    data = {
        split: datasets.Dataset.from_dict(
            {"translation": [{pair[0]: s, pair[1]: t} for s, t in sentence_pairs(n, seed)]}
        )
        for seed, (split, n) in enumerate(zip(splits, sizes))
    }
    datasets.DatasetDict(data).save_to_disk(str(root))
    return root
