"""Parallel text for machine translation: corpora, a joint sentencepiece vocabulary, token-bucketed batches."""

from topklab.data.translation.batching import PairBatch, SentenceLoader, TokenBucketLoader
from topklab.data.translation.corpora import HubParallel, ParallelTextFiles, TranslationCorpus, read_parallel
from topklab.data.translation.monolingual import MonolingualText
from topklab.data.translation.splits import TranslationSplits
from topklab.data.translation.vocab import SubwordVocab

__all__ = [
    "HubParallel",
    "MonolingualText",
    "PairBatch",
    "ParallelTextFiles",
    "SentenceLoader",
    "SubwordVocab",
    "TokenBucketLoader",
    "TranslationCorpus",
    "TranslationSplits",
    "read_parallel",
]
