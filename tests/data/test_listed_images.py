"""ImageNet-LT / Places-LT data: the OLTR lists and classnames on files written in the real layout,
decoded images (also by worker processes), exact replay and mid-epoch resume, the test-time
ensemble, and the one-line errors; the real Places-LT / ImageNet-LT lists when ../shared/data is here."""

import numpy as np
import pytest
import torch

from helpers import ROOT
from helpers.vision_files import tiny_listed, write_tree
from topklab.data.vision import ListedImageDataset
from topklab.data.vision.lists import read_split_list
from topklab.tasks import ClassificationTask
from topklab.utils.errors import DataUnavailableError, TopklabError

LT_SPLITS = ROOT.parent / "shared" / "data" / "lt_splits"


def test_lists_images_and_counts(tmp_path):
    data = tiny_listed(*write_tree(tmp_path)).splits()
    assert data.class_counts == [6, 3, 1] and data.info["sizes"] == {"train": 10, "val": 6, "test": 6}
    assert data.class_names == ["class 0 name", "class 1 name", "class 2 name"]
    x, y = next(iter(data.eval_loader("test", 4, "cpu").batches()))
    assert x.shape == (4, 3, 16, 16) and y.tolist() == [0, 0, 1, 1]
    assert data.provides()["num_classes"] == 3 and data.info["interpolation"] == "bilinear"


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_replays_exactly_and_resumes_mid_epoch(tmp_path, workers):
    data = tiny_listed(*write_tree(tmp_path), num_workers=workers).splits()
    loader = data.train_loader(batch_size=3, drop_last=False, seed=7, device="cpu")
    first = list(loader.batches(epoch=2))
    again = list(data.train_loader(batch_size=3, drop_last=False, seed=7, device="cpu").batches(epoch=2))
    resumed = list(loader.batches(epoch=2, start=2))
    assert len(first) == len(loader) == 4
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first[2:], resumed)) and len(resumed) == 2
    other = list(loader.batches(epoch=3))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, other))


def test_decoding_workers_give_the_images_of_one_process(tmp_path):
    images, lists = write_tree(tmp_path)
    one = list(tiny_listed(images, lists).splits().train_loader(4, False, 1, "cpu").batches(epoch=0))
    two = list(tiny_listed(images, lists, num_workers=2).splits().train_loader(4, False, 1, "cpu").batches(epoch=0))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(one, two))


def test_test_time_ensemble_averages_the_crops_logits(tmp_path):
    data = tiny_listed(*write_tree(tmp_path), tte="fivecrop", tte_expand=4).splits()
    x, y = next(iter(data.eval_loader("test", 6, "cpu").batches()))
    assert x.shape == (6, 5, 3, 16, 16)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 3))
    task = ClassificationTask(shot_counts=[6, 3, 1])
    per_crop = torch.stack([model(x[:, c]) for c in range(5)], dim=1).mean(1)
    torch.testing.assert_close(task.outputs(model, x, y, "test"), per_crop)


@pytest.mark.parametrize(
    "breakage,message",
    [
        ("root", "image root"),
        ("list", "split list"),
        ("label", "label 7 is outside 0..2"),
        ("first image", "first image of the val list"),
        ("classnames", "must hold 3 lines"),
    ],
)
def test_bad_listed_input_is_one_line(tmp_path, breakage, message):
    images, lists = write_tree(tmp_path)
    kwargs = {}
    if breakage == "root":
        kwargs["root"] = str(tmp_path / "nowhere")
    elif breakage == "list":
        (lists / "Tiny_train.txt").unlink()
    elif breakage == "label":
        (lists / "Tiny_test.txt").write_text("val/class_0/test0.jpg 7\n")
    elif breakage == "first image":
        (lists / "Tiny_val.txt").write_text("train/class_9/missing.jpg 0\n")
    elif breakage == "classnames":
        (lists / "classnames.txt").write_text("a a\n")
    arguments = {
        "name": "tiny_lt",
        "root": str(images),
        "split_dir": str(lists),
        "num_classes": 3,
        "lists": {s: f"Tiny_{s}.txt" for s in ("train", "val", "test")},
        "num_workers": 0,
        **kwargs,
    }
    with pytest.raises(TopklabError, match=message) as raised:
        ListedImageDataset(**arguments).splits()
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unreadable_image_is_one_line_naming_it(tmp_path, workers):
    images, lists = write_tree(tmp_path)
    broken = images / "train" / "class_1" / "train2.jpg"
    broken.write_bytes(b"not a jpeg")
    loader = tiny_listed(images, lists, num_workers=workers).splits().train_loader(20, False, 0, "cpu")
    with pytest.raises(TopklabError) as raised:
        list(loader.batches())
    assert str(raised.value).startswith(f"image {broken} cannot be read") and "\n" not in str(raised.value)


def test_missing_imagenet_train_list_says_where_it_comes_from(tmp_path):
    with pytest.raises(DataUnavailableError, match="ships with LIFT"):
        read_split_list(tmp_path / "ImageNet_LT_train.txt", 1000, "ImageNet_LT_train.txt ships with LIFT")


@pytest.mark.skipif(not LT_SPLITS.is_dir(), reason="../shared/data/lt_splits is not here")
def test_the_real_oltr_lists():
    paths, labels = read_split_list(LT_SPLITS / "Places_LT" / "Places_LT_train.txt", 365)
    counts = np.bincount(labels, minlength=365)
    assert len(paths) == 62500 and counts.max() == 4980 and counts.min() == 5
    assert ((counts > 100).sum(), ((counts >= 20) & (counts <= 100)).sum(), (counts < 20).sum()) == (131, 163, 71)
    for split, size in (("val", 7300), ("test", 36500)):
        _, labels = read_split_list(LT_SPLITS / "Places_LT" / f"Places_LT_{split}.txt", 365)
        assert len(labels) == size and len(set(np.bincount(labels).tolist())) == 1  # class-balanced
    _, labels = read_split_list(LT_SPLITS / "ImageNet_LT" / "ImageNet_LT_test.txt", 1000)
    assert len(labels) == 50000 and set(np.bincount(labels).tolist()) == {50}


@pytest.mark.integration
@pytest.mark.parametrize(
    "model,tuner,tte",
    [
        pytest.param("peft_vit_clip_b16", "adaptformer", "fivecrop", marks=pytest.mark.slow),
        ("peft_vit_clip_b16", "lora", "none"),
        ("peft_vit_in21k_b16", "vpt_deep", "none"),
    ],
)
def test_a_peft_vit_trains_on_listed_images_through_the_engine(compose_cfg, tmp_path, monkeypatch, model, tuner, tte):
    from topklab.engine.run import train
    from topklab.models.peft import PeftViT

    initialised = []
    monkeypatch.setattr(
        PeftViT,
        "initialise_from_data",
        lambda self, data, device, original=PeftViT.initialise_from_data: (
            initialised.append(self.head_from_data is not None) or original(self, data, device)
        ),
    )
    images, lists = write_tree(tmp_path)
    head = ["model.head_init.pretrained=null"] if model == "peft_vit_clip_b16" else []
    cfg = compose_cfg(
        "dataset=places_lt",
        f"dataset.root={images}",
        f"dataset.split_dir={lists}",
        "dataset.num_classes=3",
        "dataset.lists={train: Tiny_train.txt, val: Tiny_val.txt, test: Tiny_test.txt}",
        "dataset.resolution=32",
        "dataset.num_workers=0",
        f"dataset.tte={tte}",
        "dataset.tte_expand=8",
        f"model={model}",
        f"tuner={tuner}",
        "model.pretrained=false",
        "model.img_size=32",
        *head,
        "loss=stk",
        "engine.batch_size=4",
        "engine.epochs=1",
        "engine.progress=false",
        "logger=none",
        "result_file=null",
    )
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 3 and 0 <= summary["metrics"]["test"]["top1"] <= 100
    assert summary["data"]["tte"] == tte and summary["lambda"] != 0.0
    assert 0 < summary["parameters"]["trainable"] < summary["parameters"]["total"] / 10  # a frozen backbone
    assert initialised == [model == "peft_vit_in21k_b16"]  # once, before the first step; class means for IN21K


def test_class_mean_head_is_the_normalised_mean_feature_of_each_class(tmp_path):
    from topklab.models.peft import AdaptFormer, ClassMeanHead, PeftViT

    data = tiny_listed(*write_tree(tmp_path)).splits()
    torch.manual_seed(0)
    model = PeftViT(
        3,
        backbone="vit_tiny_patch16_224",
        tuner=AdaptFormer(rank=2),
        img_size=16,
        head_init=ClassMeanHead(batch_size=4),
    ).eval()
    with torch.no_grad():
        model.initialise_from_data(data, "cpu")
        features = {c: [] for c in range(3)}
        for x, y in data.feature_loader(1, "cpu").batches():  # one image at a time
            features[int(y)].append(model.features(x)[0])
        expected = torch.stack(
            [torch.nn.functional.normalize(torch.stack(features[c]).mean(0), dim=0) for c in range(3)]
        )
    torch.testing.assert_close(model.head.weight, expected, rtol=1e-5, atol=1e-6)
    x, _ = next(iter(data.feature_loader(10, "cpu").batches()))
    assert x.shape == (10, 3, 16, 16)  # one plain crop, whatever the evaluation transform
