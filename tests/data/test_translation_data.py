"""Parallel corpora, the joint vocabulary and token-bucketed batches, on files the tests write in
the real formats, and on ../shared/data/multi30k when it is there."""

import pytest
import torch

from helpers import ROOT
from helpers.translation_files import write_hub_copy, write_text_corpus
from topklab.data.translation import HubParallel, ParallelTextFiles, SubwordVocab, TokenBucketLoader
from topklab.data.translation.batching import collate
from topklab.data.translation.vocab import BOS, EOS, PAD
from topklab.utils.errors import DataUnavailableError, TopklabError

MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def corpus(tmp_path, **kwargs):
    root = tmp_path / "corpus"
    if not root.is_dir():
        write_text_corpus(root)
    return ParallelTextFiles(root=str(root), name="tiny", vocab_size=48, vocab_dir=str(tmp_path / "spm"), **kwargs)


def test_text_corpus_encodes_every_split_and_round_trips(tmp_path):
    data = corpus(tmp_path).splits()
    assert data.info["sizes"] == {"train": 240, "val": 24, "test": 20} and data.info["vocab_size"] == 48
    sources, targets = data.encoded["val"]
    assert all(s[-1] == EOS and t[-1] == EOS for s, t in zip(sources, targets))
    assert [data.vocab.decode(t) for t in targets] == data.references["val"]
    assert data.provides()["vocab_size"] == 48 and data.provides()["pad_id"] == PAD


def test_vocabulary_is_cached_by_the_fingerprint_of_its_training_text(tmp_path):
    first = corpus(tmp_path).splits().vocab.model_file
    again = corpus(tmp_path).splits().vocab.model_file
    assert first == again and len(list((tmp_path / "spm").iterdir())) == 1
    (tmp_path / "corpus" / "train.en").write_text("a different sentence .\n" * 240)
    other = corpus(tmp_path).splits().vocab.model_file
    assert other != first and len(list((tmp_path / "spm").iterdir())) == 2


def test_fairseq_bpe_joiners_are_undone(tmp_path):
    root = write_text_corpus(tmp_path / "iwslt", stems=("train", "valid", "test"), bpe_marker="@@ ")
    assert "@@ " in (root / "train.de").read_text()
    data = ParallelTextFiles(
        root=str(root),
        name="iwslt14",
        files={"train": "train", "val": "valid", "test": "test"},
        bpe_marker="@@ ",
        vocab_size=48,
        vocab_dir=str(tmp_path / "spm"),
    ).splits()
    assert not any("@@" in line for line in data.references["test"])
    assert (
        data.references["test"][0]
        == write_text_corpus(tmp_path / "plain").joinpath("test.en").read_text().split("\n")[0]
    )


def test_hub_copy_with_a_validation_hold_out(tmp_path):
    root = write_hub_copy(tmp_path / "wmt17")
    dataset = HubParallel(
        path="wmt/wmt17",
        config_name="{pair}",
        pairs=["de-en"],
        root=str(root),
        name="wmt17",
        hub_splits={"train": "train", "val": None, "test": "validation"},
        val_holdout=30,
        vocab_size=48,
        vocab_dir=str(tmp_path / "spm"),
    )
    data = dataset.splits()
    assert data.info["sizes"] == {"train": 210, "val": 30, "test": 24}
    assert len(data.indices["val"]) == 30 and data.indices["val"] == sorted(data.indices["val"])


def test_token_batches_respect_the_budget_and_cover_every_pair_once():
    torch.manual_seed(0)
    sources = [[5] * int(n) + [EOS] for n in torch.randint(1, 30, (300,))]
    targets = [[6] * int(n) + [EOS] for n in torch.randint(1, 30, (300,))]
    loader = TokenBucketLoader(sources, targets, max_tokens=200, seed=3)
    seen = []
    for x, y in loader.batches(epoch=2):
        assert x.source.numel() <= 200 and y.numel() <= 200
        assert torch.equal(x.decoder_input[:, 0], torch.full((len(y),), BOS))
        seen += [int((row != PAD).sum()) for row in y]
    assert sorted(seen) == sorted(len(t) for t in targets)
    assert len(list(loader.batches(epoch=5))) == len(loader)


def test_token_batches_are_a_function_of_seed_and_epoch_and_resume_mid_epoch():
    sources = [[5] * (i % 17 + 1) + [EOS] for i in range(200)]
    targets = [[6] * (i % 13 + 1) + [EOS] for i in range(200)]
    loader = TokenBucketLoader(sources, targets, max_tokens=64, seed=1)
    first = [y for _, y in loader.batches(epoch=4)]
    again = [y for _, y in TokenBucketLoader(sources, targets, max_tokens=64, seed=1).batches(epoch=4)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    resumed = [y for _, y in loader.batches(epoch=4, start=5)]
    assert all(torch.equal(a, b) for a, b in zip(first[5:], resumed)) and len(resumed) == len(first) - 5
    other_epoch = [y for _, y in loader.batches(epoch=5)]
    assert any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(first, other_epoch))


def test_collate_shifts_the_target_behind_bos():
    x, y = collate([[7, 8, EOS], [9, EOS]], [[4, EOS], [5, 6, 7, EOS]])
    assert y.tolist() == [[4, EOS, PAD, PAD], [5, 6, 7, EOS]]
    assert x.decoder_input.tolist() == [[BOS, 4, PAD, PAD], [BOS, 5, 6, 7]]
    assert x.source.tolist() == [[7, 8, EOS], [9, EOS, PAD]] and len(x[1:]) == 1


@pytest.mark.parametrize(
    "breakage,message",
    [
        ("missing", "not found"),
        ("uneven", "has 24 lines but .* has 23"),
        ("pair", r"not in this corpus \(it has de, en\)"),
        ("budget", "smaller than the longest sentence pair"),
        ("folder", "folder"),
    ],
)
def test_bad_corpus_input_is_one_line(tmp_path, breakage, message):
    root = write_text_corpus(tmp_path / "corpus")
    kwargs = {"root": str(root), "name": "tiny", "vocab_size": 48, "vocab_dir": str(tmp_path / "spm")}
    if breakage == "missing":
        (root / "test.en").unlink()
    elif breakage == "uneven":
        (root / "val.en").write_text("".join(f"line {i}\n" for i in range(23)))
    elif breakage == "pair":
        kwargs["pair"] = "fr-en"
    elif breakage == "folder":
        kwargs["root"] = str(tmp_path / "nowhere")
    with pytest.raises(TopklabError, match=message) as raised:
        data = ParallelTextFiles(**kwargs).splits()
        if breakage == "budget":
            data.train_loader(batch_size=4, drop_last=False, seed=0, device="cpu")
    assert "\n" not in str(raised.value)


def test_hub_dataset_errors_name_the_dataset_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(TopklabError, match="unknown language pair xx-en; choose one of de-en"):
        HubParallel(
            path="wmt/wmt17", config_name="{pair}", pairs=["de-en"], root=str(tmp_path), name="wmt17", pair="xx-en"
        )
    dataset = HubParallel(
        path="topklab-test/no-such-corpus",
        config_name="{pair}",
        pairs=["de-en"],
        root=str(tmp_path / "none"),
        name="wmt17",
        cache_dir=str(tmp_path / "cache"),
    )
    with pytest.raises(DataUnavailableError, match="save_to_disk") as raised:
        dataset.splits()
    assert "\n" not in str(raised.value)


def test_vocabulary_sizes_a_corpus_cannot_fill_are_refused(tmp_path):
    with pytest.raises(TopklabError, match="lower dataset.vocab_size"):
        SubwordVocab.learn([["ab ba"] * 10, ["ab"] * 10], 500, tmp_path)


@pytest.mark.integration  # the real corpus, its BPE and vocabulary: the default tier, not test-unit
@pytest.mark.skipif(not MULTI30K.is_dir(), reason="../shared/data/multi30k is not here")
def test_multi30k_from_the_shared_folder(tmp_path):
    data = ParallelTextFiles(
        root=str(MULTI30K), name="multi30k", vocab_size=5000, vocab_dir=str(tmp_path / "spm")
    ).splits()
    assert data.info["sizes"] == {"train": 29000, "val": 1014, "test": 1000}
    assert data.references["test"][0].startswith("A man in an orange hat")
    loader = data.train_loader(2048, False, 0, "cpu")
    longest_sides = sum(max(len(s), len(t)) for s, t in zip(*data.encoded["train"]))
    assert len(loader) <= 1.1 * longest_sides / 2048  # length buckets waste little on padding


def test_full_batches_hold_a_multiple_of_the_batch_multiple():
    torch.manual_seed(4)
    sources = [[5] * int(n) + [EOS] for n in torch.randint(1, 12, (500,))]
    targets = [[6] * int(n) + [EOS] for n in torch.randint(1, 12, (500,))]
    loose = TokenBucketLoader(sources, targets, max_tokens=100, seed=0)
    loader = TokenBucketLoader(sources, targets, max_tokens=100, seed=0, batch_multiple=8)
    sizes = [len(batch) for batch in loader.fixed_batches]
    assert all(n % 8 == 0 for n in sizes[:-1]) and sorted(sum(loader.fixed_batches, [])) == list(range(500))
    assert any(n % 8 for n in (len(batch) for batch in loose.fixed_batches[:-1]))  # the rule changes something
    for batch in loader.fixed_batches:
        assert len(batch) * max(max(len(sources[i]), len(targets[i])) for i in batch) <= 100
