"""The ImageNet path of Petersen et al.'s Tables 2, 3, 5: embedding extraction through a frozen timm
backbone (end to end on a tiny image tree in the real layout, resumed after an interrupted shard),
and the embedding dataset (difftopk's hold-out, batches straight from the memory map, one-line
errors)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import ROOT
from helpers.embedding_files import write_embeddings, write_image_tree
from topklab.data.embeddings import Backbone, EmbeddingDataset
from topklab.data.embeddings.dataset import MappedLoader
from topklab.data.embeddings.extract import extract, list_image_tree
from topklab.data.tensor_loader import TensorLoader
from topklab.utils.errors import DataUnavailableError, TopklabError

SPLITS = {"train": "train", "test": "val"}


def tiny_backbone(**overrides) -> Backbone:
    return Backbone(**{"name": "test_efficientnet", "resolution": 32, "pretrained": False, **overrides})


def run_extraction(tree, out, **kwargs):
    torch.manual_seed(0)  # random weights, the same in every call
    return extract(
        tiny_backbone(),
        tree,
        out,
        SPLITS,
        batch_size=2,
        shard_size=5,
        num_workers=0,
        device="cpu",
        progress=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_image_tree(tmp_path_factory.mktemp("imagenet"))


def test_an_image_tree_lists_sorted_classes_and_files(tree):
    files, labels, classes = list_image_tree(tree / "train")
    assert classes == [f"n{c:08d}" for c in range(6)] and len(files) == 18
    assert files[:2] == ["n00000000/n00000000_0.JPEG", "n00000000/n00000000_1.JPEG"] and labels.tolist() == sorted(
        labels.tolist()
    )
    val_files, val_labels, _ = list_image_tree(tree / "val", classes)
    assert len(val_files) == 6 and val_labels.tolist() == list(range(6))


def test_extraction_end_to_end_matches_a_per_image_forward(tree, tmp_path):
    report = run_extraction(tree, tmp_path / "emb")
    assert {s: report[s]["images"] for s in report} == {"train": 18, "test": 6}
    out = tmp_path / "emb"
    assert (out / "classes.txt").read_text().split() == [f"n{c:08d}" for c in range(6)]
    rows = np.load(out / "train" / "embeddings.npy", mmap_mode="r")
    assert rows.dtype == np.float16 and rows.shape == (18, 256)
    assert np.load(out / "test" / "labels.npy").tolist() == list(range(6))
    files = (out / "train" / "files.txt").read_text().split()
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["backbone"]["embedding_dim"] == 256 and provenance["backbone"]["interpolation"] == "bicubic"
    assert json.loads((out / "train" / "progress.json").read_text())["complete"]
    torch.manual_seed(0)  # the slow, obvious reference: the same backbone on one image at a time
    backbone = tiny_backbone()
    model = backbone.model(torch.device("cpu"))
    transform = backbone.transform(model)
    from PIL import Image

    for i in (0, 7, 17):
        with torch.no_grad():
            expected = model(transform(Image.open(tree / "train" / files[i]).convert("RGB"))[None])[0]
        assert np.allclose(rows[i].astype(np.float32), expected.numpy(), rtol=2e-3, atol=2e-3)


def test_extraction_resumes_after_an_interrupted_shard_with_the_same_arrays(tree, tmp_path, monkeypatch):
    run_extraction(tree, tmp_path / "whole")
    calls = {"n": 0}
    original = torch.nn.Module.__call__

    def interrupt_mid_shard(self, *args, **kwargs):
        if type(self).__name__ == "EfficientNet":
            calls["n"] += 1
            if calls["n"] == 6:  # batch 6 of 2 images: the middle of the third shard of 5 images
                raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "__call__", interrupt_mid_shard)
    with pytest.raises(KeyboardInterrupt):
        run_extraction(tree, tmp_path / "resumed")
    progress = json.loads((tmp_path / "resumed" / "train" / "progress.json").read_text())
    assert progress["done"] == [0, 1] and not progress["complete"]
    with pytest.raises(TopklabError, match="incomplete"):
        EmbeddingDataset(str(tmp_path / "resumed"), "tiny", holdout=2).splits()
    monkeypatch.setattr(torch.nn.Module, "__call__", original)
    calls["n"] = 0
    report = run_extraction(tree, tmp_path / "resumed")
    assert report["train"]["extracted"] == 8  # shards 2 and 3 (5 + 3 images), not the finished ones
    for split in ("train", "test"):
        for name in ("embeddings.npy", "labels.npy", "files.txt"):
            assert (tmp_path / "resumed" / split / name).read_bytes() == (
                tmp_path / "whole" / split / name
            ).read_bytes()
    assert run_extraction(tree, tmp_path / "resumed")["train"]["extracted"] == 0  # complete: nothing to do


def test_extraction_errors_are_one_line(tree, tmp_path):
    with pytest.raises(DataUnavailableError, match="not a folder"):
        run_extraction(tmp_path / "nowhere", tmp_path / "e1")
    odd = write_image_tree(tmp_path / "odd", classes=2)
    (odd / "val" / "n99999999").mkdir()
    (odd / "val" / "n99999999" / "x.JPEG").write_bytes(b"")
    with pytest.raises(TopklabError, match="class folders the training split does not have"):
        run_extraction(odd, tmp_path / "e2")
    broken = write_image_tree(tmp_path / "broken", classes=2)
    (broken / "train" / "n00000001" / "n00000001_1.JPEG").write_bytes(b"not a jpeg")
    with pytest.raises(TopklabError, match=r"n00000001_1.JPEG cannot be read") as err:
        run_extraction(broken, tmp_path / "e3")
    assert "\n" not in str(err.value)
    run_extraction(tree, tmp_path / "e4")
    torch.manual_seed(0)
    with pytest.raises(TopklabError, match="started with another backbone"):
        extract(
            tiny_backbone(resolution=24),
            tree,
            tmp_path / "e4",
            SPLITS,
            batch_size=2,
            shard_size=5,
            num_workers=0,
            device="cpu",
            progress=False,
        )
    with pytest.raises(ValueError, match="not a timm model"):
        Backbone("no_such_net", 32)
    with pytest.raises(DataUnavailableError, match="backbone.checkpoint=/nowhere/w.pth does not exist"):
        Backbone("test_efficientnet", 32, checkpoint="/nowhere/w.pth").model(torch.device("cpu"))


def test_missing_pretrained_weights_offline_are_one_line(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(
        DataUnavailableError, match="pretrained weights could not be loaded .*backbone.checkpoint="
    ) as err:
        Backbone("test_efficientnet", 32, pretrained=True).model(torch.device("cpu"))
    assert "\n" not in str(err.value)


def test_an_unreadable_image_in_a_decoding_worker_is_one_line(tmp_path):
    broken = write_image_tree(tmp_path / "broken", classes=2)
    (broken / "train" / "n00000000" / "n00000000_2.JPEG").write_bytes(b"not a jpeg")
    torch.manual_seed(0)
    with pytest.raises(TopklabError, match=r"^image .*n00000000_2.JPEG cannot be read") as err:
        extract(
            tiny_backbone(),
            broken,
            tmp_path / "out",
            SPLITS,
            batch_size=2,
            shard_size=5,
            num_workers=1,
            device="cpu",
            progress=False,
        )
    assert "\n" not in str(err.value) and "Traceback" not in str(err.value)


def test_embeddings_beyond_float16_are_refused_not_stored_as_inf(tree, tmp_path, monkeypatch):
    original = torch.nn.Module.__call__

    def huge(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        return out * 1e12 if type(self).__name__ == "EfficientNet" else out

    monkeypatch.setattr(torch.nn.Module, "__call__", huge)
    with pytest.raises(TopklabError, match="non-finite embeddings for .*n00000000_0.JPEG .*backbone.storage=float32"):
        run_extraction(tree, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "train" / "progress.json").read_text())["done"] == []


def test_a_local_checkpoint_file_loads(tmp_path):
    import timm

    torch.manual_seed(3)
    source = timm.create_model("test_efficientnet", pretrained=False)
    torch.save(source.state_dict(), tmp_path / "w.pth")
    loaded = Backbone("test_efficientnet", 32, checkpoint=str(tmp_path / "w.pth")).model(torch.device("cpu"))
    assert torch.equal(loaded.conv_stem.weight, source.conv_stem.weight)


def test_the_backbone_configs_build_the_papers_architectures():
    import timm
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    configs = {p.stem: OmegaConf.load(p) for p in (ROOT / "configs" / "backbone").glob("*.yaml")}
    backbones = {name: instantiate(cfg) for name, cfg in configs.items()}
    assert {name: (b.name, b.resolution, b.storage) for name, b in backbones.items()} == {
        "resnext101_32x48d_wsl_320": ("resnext101_32x48d.fb_wsl_ig1b_ft_in1k", 320, "float16"),
        "resnext101_32x48d_wsl_224": ("resnext101_32x48d.fb_wsl_ig1b_ft_in1k", 224, "float16"),
        "tf_efficientnet_l2_ns_800": ("tf_efficientnet_l2.ns_jft_in1k", 800, "float16"),
    }
    assert backbones["tf_efficientnet_l2_ns_800"].precision == "fp16"
    assert timm.get_pretrained_cfg("resnext101_32x48d.fb_wsl_ig1b_ft_in1k").url.endswith(
        "ig_resnext101_32x48-3e41cc8a.pth"
    )
    with torch.device("meta"):  # the architecture without allocating its 826 M parameters
        model = timm.create_model("resnext101_32x48d", pretrained=False, num_classes=0)
    assert model.num_features == 2048 and 820e6 < sum(p.numel() for p in model.parameters()) < 830e6


@pytest.mark.integration
def test_the_extraction_script_end_to_end_and_its_one_line_errors(tree, tmp_path):
    common = [
        sys.executable,
        str(ROOT / "scripts" / "extract_embeddings.py"),
        f"image_root={tree}",
        "backbone.name=test_efficientnet",
        "backbone.resolution=32",
        "backbone.pretrained=false",
        "num_workers=0",
        "device=cpu",
        "progress=false",
        f"paths.log_dir={tmp_path}/logs",
    ]
    done = subprocess.run([*common, f"out_dir={tmp_path}/emb"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train: 18 images from train" in done.stdout and (tmp_path / "emb" / "test" / "embeddings.npy").exists()
    bad = subprocess.run(
        [*common, f"out_dir={tmp_path}/emb2", "image_root=/nowhere"], capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        "error: /nowhere/train is not a folder"
    )
    assert not (tmp_path / "emb2" / "train").exists()
    unknown = subprocess.run([*common, "backbone=nope"], capture_output=True, text=True, timeout=300)
    assert unknown.returncode == 2 and "unknown backbone 'nope'" in unknown.stderr


def test_the_holdout_is_difftopks(tmp_path):
    root = write_embeddings(tmp_path / "emb", classes=60, sizes={"train": 500, "test": 100})
    data = EmbeddingDataset(str(root), "tiny", holdout=120, split_seed=0).splits()
    torch.manual_seed(0)  # difftopk's train_imagenet.py: torch.manual_seed(seed), then torch.randperm(N)
    reference = torch.randperm(500)
    assert data.parts["val"][1].tolist() == reference[:120].tolist()
    assert data.parts["train"][1].tolist() == reference[120:].tolist()
    assert data.sizes() == {"train": 380, "val": 120, "test": 100}
    labels = np.load(root / "train" / "labels.npy")
    assert data.targets("val").tolist() == labels[reference[:120].numpy()].tolist()
    assert data.provides()["in_features"] == 16 and data.num_classes == 60 and sum(data.class_counts) == 380


def test_batches_come_from_the_memory_map_in_the_epochs_order(tmp_path):
    root = write_embeddings(tmp_path / "emb", classes=60, sizes={"train": 300, "test": 50})
    data = EmbeddingDataset(str(root), "tiny", holdout=40).splits()
    stored = np.load(root / "train" / "embeddings.npy").astype(np.float32)
    index = data.parts["train"][1]
    loader = data.train_loader(64, drop_last=True, seed=3, device="cpu")
    reference = TensorLoader(
        torch.from_numpy(stored[index]), data.targets("train"), 64, shuffle=True, drop_last=True, seed=3
    )
    assert len(loader) == len(reference) == 4
    for epoch in (1, 0, 2):  # any epoch, in any order (a resumed run)
        for (x, y), (x_ref, y_ref) in zip(loader.batches(epoch), reference.batches(epoch)):
            assert x.dtype == torch.float32 and torch.equal(x, x_ref) and torch.equal(y, y_ref)
    resumed = list(loader.batches(2, start=3))
    assert len(resumed) == 1 and torch.equal(resumed[0][0], list(reference.batches(2))[3][0])
    test = list(data.eval_loader("test", 20, "cpu").batches())
    assert torch.equal(
        torch.cat([x for x, _ in test]), torch.from_numpy(np.load(root / "test" / "embeddings.npy").astype(np.float32))
    )
    assert isinstance(loader, MappedLoader) and not isinstance(data.parts["train"][1], torch.Tensor)


def test_bad_embeddings_are_one_line_errors(tmp_path):
    with pytest.raises(DataUnavailableError, match="no embeddings at"):
        EmbeddingDataset(str(tmp_path / "none"), "x", holdout=10).splits()
    short = write_embeddings(tmp_path / "short", classes=60, sizes={"train": 200, "test": 50})
    np.save(short / "train" / "labels.npy", np.zeros(199, dtype=np.int64))
    with pytest.raises(TopklabError, match="200 embeddings but 199 labels"):
        EmbeddingDataset(str(short), "x", holdout=10).splits()
    out_of_range = write_embeddings(tmp_path / "range", classes=60, sizes={"train": 200, "test": 50})
    labels = np.load(out_of_range / "test" / "labels.npy")
    labels[3] = 60
    np.save(out_of_range / "test" / "labels.npy", labels)
    with pytest.raises(TopklabError, match="class index 60 is out of range for the 60 classes"):
        EmbeddingDataset(str(out_of_range), "x", holdout=10).splits()
    good = write_embeddings(tmp_path / "good", classes=60, sizes={"train": 200, "test": 50})
    with pytest.raises(TopklabError, match="holdout=200 leaves no training rows"):
        EmbeddingDataset(str(good), "x", holdout=200).splits()
    corrupt = write_embeddings(tmp_path / "corrupt", classes=60, sizes={"train": 200, "test": 50})
    (corrupt / "test" / "embeddings.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(TopklabError, match="corrupt array"):
        EmbeddingDataset(str(corrupt), "x", holdout=10).splits()
    with pytest.raises(ValueError, match="holdout"):
        EmbeddingDataset(str(corrupt), "x", holdout=0)


@pytest.mark.parametrize(
    "layout,train_key,test_key,dtype",
    [
        ("wsl_1k", "train", "test", torch.float32),
        ("imagenet21k_p", "imagenet21k_train", "imagenet21k_val", torch.float16),
        ("efficientnet_l2", "train", "val", torch.float16),
    ],
)
def test_difftopks_published_files_convert_into_the_datasets_layout(tmp_path, layout, train_key, test_key, dtype):
    import subprocess
    import sys

    torch.manual_seed(0)
    data = {
        f"{train_key}_embeddings": torch.randn(300, 8).to(dtype),
        f"{train_key}_labels": torch.randint(0, 60, (300,)),
        f"{test_key}_embeddings": torch.randn(50, 8).to(dtype),
        f"{test_key}_labels": torch.randint(0, 60, (50,)),
    }
    data[f"{train_key}_labels"][0] = 59  # difftopk: classes = the largest label + 1
    torch.save(data, tmp_path / "file.p")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "convert_difftopk_embeddings.py"),
            str(tmp_path / "file.p"),
            str(tmp_path / "emb"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "train 300 rows, test 50 rows" in done.stdout
    split = EmbeddingDataset(str(tmp_path / "emb"), "converted", holdout=40).splits()
    assert split.num_classes == 60 and split.sizes() == {"train": 260, "val": 40, "test": 50}
    stored = np.load(tmp_path / "emb" / "test" / "embeddings.npy")
    assert stored.dtype == (np.float16 if dtype == torch.float16 else np.float32)
    assert np.array_equal(stored, data[f"{test_key}_embeddings"].numpy())
    assert split.targets("test").tolist() == data[f"{test_key}_labels"].tolist()
    assert json.loads((tmp_path / "emb" / "provenance.json").read_text())["layout"] == layout


def test_a_file_of_another_layout_is_one_line(tmp_path):
    from topklab.data.embeddings.convert import convert_difftopk

    torch.save({"x": torch.zeros(2)}, tmp_path / "odd.p")
    with pytest.raises(TopklabError, match="none of difftopk's layouts"):
        convert_difftopk(tmp_path / "odd.p", tmp_path / "out")
    (tmp_path / "broken.p").write_bytes(b"nonsense")
    with pytest.raises(TopklabError, match="is not a readable torch file"):
        convert_difftopk(tmp_path / "broken.p", tmp_path / "out")
    with pytest.raises(DataUnavailableError, match="does not exist"):
        convert_difftopk(tmp_path / "none.p", tmp_path / "out")
