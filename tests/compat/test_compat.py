import pytest
import torch

from topklab.compat.torchvision_cpu import ensure_torchvision_importable


def test_torchvision_and_timm_import_and_run_on_this_machine():
    torchvision = pytest.importorskip("torchvision")
    timm = pytest.importorskip("timm")
    x = torch.randn(2, 3, 32, 32)
    assert torchvision.models.resnet18(num_classes=10)(x).shape == (2, 10)
    assert timm.create_model("resnet18", pretrained=False, num_classes=7)(x).shape == (2, 7)


def test_shim_is_idempotent():
    first = ensure_torchvision_importable()
    assert ensure_torchvision_importable() == first
    # where torchvision's compiled ops load, the shim defines nothing
    if not first:
        assert torch.ops.torchvision.nms is not None
