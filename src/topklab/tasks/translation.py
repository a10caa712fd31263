"""Machine translation: decode each sentence, score against the references with sacreBLEU."""

from __future__ import annotations

import sacrebleu
import torch.nn.functional as F

from topklab.data.translation.vocab import PAD
from topklab.tasks.base import Task
from topklab.tasks.search import BeamSearch, GreedySearch
from topklab.utils.checks import check_int

SCALARS = ("bleu", "chrf", "bleu_tok", "loss")


class TranslationTask(Task):
    """Translations scored by corpus BLEU, chrF and the teacher-forced loss.

    Metrics (per split): ``bleu`` — sacreBLEU with its 13a tokenisation (the reported metric;
    its signature is ``bleu_signature``), detokenised BLEU where the references are raw text; over
    pre-tokenised references (fairseq's IWSLT14 files) it is 13a over tokenised text, not
    comparable to published sacreBLEU; ``bleu_tok`` — BLEU on the corpus's own whitespace tokens
    (tokenize=none: fairseq-generate's "tokenised BLEU" for such corpora, labelled as such); ``chrf``; ``loss`` — the mean negative
    log-likelihood per target token (no smoothing; lower is better); ``translations`` — the
    detokenised hypotheses, in the split's order.

    Parameters
    ----------
    vocab : the data's :class:`~topklab.data.translation.SubwordVocab` (given by the data)
    search : how test (and train) sentences are decoded, e.g. :class:`BeamSearch` (beam 5)
    val_search : how validation sentences are decoded each epoch, e.g. :class:`GreedySearch`
    max_output_len : int >= 1, the widest hypothesis (ids with eos) any search may return

    Examples
    --------
    >>> task = TranslationTask(vocab=None)
    >>> task.primary, task.higher_is_better("bleu"), task.higher_is_better("loss")
    ('bleu', True, False)
    """

    primary = "bleu"

    def __init__(self, vocab, search=None, val_search=None, max_output_len: int = 256):
        check_int("task.max_output_len", max_output_len)
        self.vocab = vocab
        self.search = search or BeamSearch()
        self.val_search = val_search or GreedySearch()
        self.max_output_len = max_output_len

    def outputs(self, model, x, y, split: str) -> dict:
        search = self.val_search if split == "val" else self.search
        log_probs = F.log_softmax(model(x).float(), dim=-1)
        nll = -log_probs.gather(-1, y[..., None])[..., 0]
        real = y != PAD
        return {
            "hypotheses": search(model, x.source, self.max_output_len),
            "nll": (nll * real).sum(1).double(),
            "tokens": real.sum(1),
        }

    def metrics(self, outputs: dict, references: list[str]) -> dict:
        hypotheses = [self.vocab.decode(row) for row in outputs["hypotheses"].tolist()]
        bleu = sacrebleu.metrics.BLEU()
        score = bleu.corpus_score(hypotheses, [references])
        return {
            "bleu": score.score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
            "bleu_tok": sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none").score,
            "loss": float(outputs["nll"].sum() / outputs["tokens"].sum()),
            "bleu_signature": str(bleu.get_signature()),
            "translations": hypotheses,
        }

    def higher_is_better(self, metric: str) -> bool:
        if metric not in SCALARS:
            raise ValueError(f"select on one of {', '.join(SCALARS)} (got {metric!r})")
        return metric != "loss"

    def scalar_metrics(self, metrics: dict) -> dict:
        return {k: metrics[k] for k in SCALARS if k in metrics}
