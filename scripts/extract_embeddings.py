"""Extract penultimate-layer embeddings of an image tree through a frozen timm backbone, for
Petersen et al.'s ImageNet fine-tuning tables (README, 'ImageNet fine-tuning').

    python scripts/extract_embeddings.py image_root=/data/imagenet                      # ResNeXt-101 WSL, 320 px
    python scripts/extract_embeddings.py backbone=tf_efficientnet_l2_ns_800 image_root=/data/imagenet
    python scripts/extract_embeddings.py backbone=resnext101_32x48d_wsl_224 image_root=/data/imagenet21k_resized \\
        'splits={train: imagenet21k_train, test: imagenet21k_val}'
    python scripts/extract_embeddings.py ... backbone.checkpoint=/weights/ig_resnext101_32x48-3e41cc8a.pth

Rerunning the same command resumes at the first unfinished shard.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOPKLAB_ROOT", str(ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

import topklab.launch  # noqa: E402,F401  (registers Hydra's resolver for configs/hydra/launcher/joblib.yaml)
from topklab.cli import check_group_choices  # noqa: E402
from topklab.data.embeddings.extract import extract  # noqa: E402
from topklab.engine.build import build  # noqa: E402
from topklab.utils.errors import TopklabError, fail  # noqa: E402
from topklab.utils.provenance import collect  # noqa: E402


@hydra.main(config_path="../configs", config_name="extract_embeddings", version_base="1.3")
def main(cfg: DictConfig) -> None:
    # A TopklabError leaves the task: Hydra's job callback (topklab.launch) prints it and exits 2.
    backbone = build(cfg.backbone, "backbone")
    report = extract(
        backbone,
        cfg.image_root,
        cfg.out_dir,
        OmegaConf.to_container(cfg.splits),
        cfg.batch_size,
        cfg.shard_size,
        cfg.num_workers,
        cfg.device,
        cfg.progress,
        provenance=collect(ROOT),
    )
    for split, done in report.items():
        rate = f"{done['images_per_s']:.1f} images/s" if done["images_per_s"] else "already complete"
        print(f"{split}: {done['images']} images from {done['source']} ({rate})")
    print(f"embeddings: {cfg.out_dir}")


if __name__ == "__main__":
    try:
        check_group_choices(
            [a for a in sys.argv[1:] if not a.startswith("-")], ROOT / "configs", exclude=("hydra", "local", "preset")
        )
    except TopklabError as err:
        fail(err)
    main()
