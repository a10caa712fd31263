"""PEL/LIFT's parameter-efficient ViT: each tuner trains only its own parameters (the frozen backbone
gets no gradient), AdaptFormer and LoRA leave the backbone's output unchanged at step 0, and the
trainable-parameter counts of ViT-B/16 are those of the methods' definitions."""

import pytest
import torch

from topklab.models.peft import VPT, AdaptFormer, BiasOnly, FullFineTuning, LinearProbe, LoRA, PeftViT, default_rank
from topklab.utils.errors import DataUnavailableError

VIT_B = "vit_base_patch16_224"  # the counts are ViT-B/16's; the behaviour tests take the 12-layer tiny ViT (width 192)
DIM, LAYERS = 768, 12
VIT_TINY, TINY_DIM = "vit_tiny_patch16_224", 192


def vit(tuner, num_classes=100, seed=0, backbone=VIT_TINY):
    torch.manual_seed(seed)
    return PeftViT(num_classes, backbone=backbone, tuner=tuner, img_size=32)


def test_default_rank_follows_pel():
    assert [default_rank(c, 12) for c in (100, 365, 1000, 8142)] == [4, 8, 32, 256]


@pytest.mark.parametrize(
    "tuner,expected",
    [
        (AdaptFormer(rank=4), LAYERS * (2 * DIM + (DIM * 4 + 4) + (4 * DIM + DIM) + 1)),  # PEL: 101,436
        (LoRA(rank=4), LAYERS * 2 * (DIM * 4 + 4 * DIM)),
        (VPT(length=10, deep=True), LAYERS * 10 * DIM),
        (VPT(length=10, deep=False), 10 * DIM),
        (BiasOnly(), LAYERS * (DIM + 3 * DIM + DIM + DIM + 4 * DIM + DIM)),  # norm1, qkv, proj, norm2, fc1, fc2
        (LinearProbe(), 0),
        (
            FullFineTuning(),
            LAYERS * (2 * 2 * DIM + DIM * 3 * DIM + 3 * DIM + DIM * DIM + DIM + 2 * DIM * 4 * DIM + 4 * DIM + DIM),
        ),
    ],
    ids=["adaptformer", "lora", "vpt_deep", "vpt_shallow", "bias_only", "linear_probe", "full"],
)
def test_trainable_parameter_counts_of_vit_b16(tuner, expected):
    model = vit(tuner, backbone=VIT_B)
    assert model.trainable_parameters == expected + 100 * DIM  # + the cosine head
    assert sum(p.numel() for group in model.parameter_groups() for p in group["params"]) == model.trainable_parameters
    assert expected != 101436 or isinstance(tuner, AdaptFormer)


@pytest.mark.parametrize(
    "tuner",
    [AdaptFormer(rank=4), LoRA(rank=4), VPT(length=3), BiasOnly()],
    ids=["adaptformer", "lora", "vpt", "bias_only"],
)
def test_only_the_branch_and_head_get_gradients(tuner):
    model = vit(tuner, num_classes=5)
    if isinstance(tuner, (AdaptFormer, LoRA)):  # their zero-initialised factor would block the other's gradient
        for p in model.trained:
            p.data.normal_(0, 0.02)
    model(torch.randn(2, 3, 32, 32)).logsumexp(-1).sum().backward()
    trained = {id(p) for p in model.trained} | {id(p) for p in model.head.parameters()}
    for name, p in model.named_parameters():
        if id(p) in trained:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None and not p.requires_grad, name


@pytest.mark.parametrize("tuner", [AdaptFormer(rank=4), LoRA(rank=4)], ids=["adaptformer", "lora"])
def test_the_branch_leaves_the_backbone_output_unchanged_at_step_0(tuner):
    tuned, plain = vit(tuner, seed=3), vit(LinearProbe(), seed=3)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(tuned.features(x), plain.features(x))
    with torch.no_grad():
        for p in tuned.trained:
            p.add_(0.05)
    assert not torch.allclose(tuned.features(x), plain.features(x))


def test_deep_prompts_change_the_features_and_keep_the_class_token_first():
    prompted, plain = vit(VPT(length=4), seed=1), vit(LinearProbe(), seed=1)
    x = torch.randn(2, 3, 32, 32)
    assert prompted.features(x).shape == (2, TINY_DIM) and not torch.allclose(prompted.features(x), plain.features(x))


def test_pretrained_weights_offline_are_one_line_naming_them(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(DataUnavailableError, match="pretrained weights of vit_tiny_patch16_224.augreg_in21k") as raised:
        PeftViT(10, backbone="vit_tiny_patch16_224.augreg_in21k", pretrained=True, img_size=32)
    assert str(tmp_path) in str(raised.value) and "\n" not in str(raised.value)


def test_unknown_backbone_is_refused():
    with pytest.raises(ValueError, match="not a timm model"):
        PeftViT(10, backbone="vit_nonexistent_patch99")


def test_text_head_is_clip_zero_shot_through_the_visual_projection():
    import open_clip

    from topklab.models.peft import TextHead

    normalize = torch.nn.functional.normalize
    names = ["dog", "cat", "red car"]
    torch.manual_seed(0)
    weights = TextHead("ViT-B-16", pretrained=None, templates=["a photo of a {}.", "a {}."])(names, out_features=768)
    torch.manual_seed(0)
    clip = open_clip.create_model("ViT-B-16", pretrained=None).eval()  # the same random tower
    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    with torch.no_grad():  # templates averaged after normalising each, then normalised (slow, per class)
        text = normalize(
            torch.stack(
                [
                    normalize(clip.encode_text(tokenizer([f"a photo of a {n}.", f"a {n}."])), dim=-1).mean(0)
                    for n in names
                ]
            ),
            dim=-1,
        )
        pulled_back = text @ clip.visual.proj.T
        features = torch.randn(4, 768)
        torch.testing.assert_close(weights, normalize(pulled_back, dim=-1))
        # ⟨x, P t_c⟩ = ⟨x P, t_c⟩: the head scores a feature as CLIP's zero-shot classifier does, up to ‖P t_c‖
        torch.testing.assert_close(
            (features @ weights.T) * pulled_back.norm(dim=1),
            (features @ clip.visual.proj) @ text.T,
            rtol=1e-4,
            atol=1e-4,
        )


def test_the_head_starts_from_the_text_weights_and_needs_class_names():
    from topklab.models.peft import TextHead

    head = TextHead("ViT-B-16", pretrained=None)
    torch.manual_seed(0)
    model = PeftViT(2, backbone="vit_base_patch16_224", img_size=32, head_init=head, class_names=["dog", "cat"])
    assert model.head.weight.shape == (2, 768)
    with pytest.raises(ValueError, match="needs the 2 class names"):
        PeftViT(2, backbone="vit_base_patch16_224", img_size=32, head_init=head)


def test_missing_clip_weights_are_one_line(tmp_path, monkeypatch):
    from topklab.models.peft import TextHead

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataUnavailableError, match="CLIP weights ViT-B-16/openai") as raised:
        TextHead("ViT-B-16", pretrained="openai", cache_dir=str(tmp_path))(["dog"], 768)
    assert "\n" not in str(raised.value)


def test_the_clip_config_builds_quickgelu_towers_as_openai_trained_them(compose_cfg):
    from hydra.utils import instantiate

    cfg = compose_cfg(
        "model=peft_vit_clip_b16", "model.pretrained=false", "model.img_size=32", "model.head_init.pretrained=null"
    )
    head = instantiate(cfg.model.head_init)
    clip, _ = head._clip()
    assert "QuickGELU" in type(clip.transformer.resblocks[0].mlp.gelu).__name__
    model = instantiate(cfg.model, num_classes=2, class_names=["dog", "cat"])
    assert "QuickGELU" in type(model.vit.blocks[0].block.mlp.act).__name__
