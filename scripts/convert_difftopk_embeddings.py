"""Convert one of difftopk's published embedding files into the layout the embedding datasets read.

    python scripts/convert_difftopk_embeddings.py ImageNet_embeddings_labels_train_test_IGAM_Resnext101_32x48d_320.p \\
        .data/embeddings/imagenet1k_resnext101_32x48d_wsl_320 [--storage float16]

Then the rows of Tables 2, 3 and 5 train on it (`make reproduce-petersen-imagenet1k`). The 21K-P file
goes to .data/embeddings/imagenet21kp_resnext101_32x48d_wsl_224, the EfficientNet-L2 file to
.data/embeddings/imagenet1k_tf_efficientnet_l2_ns_800 (the datasets' default roots).
"""

import argparse
import sys

import topklab  # noqa: F401  (torchvision shim)
from topklab.data.embeddings.convert import convert_difftopk
from topklab.utils.errors import TopklabError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a difftopk .p file")
    parser.add_argument("out_dir", help="the embeddings folder to write (classes.txt, train/, test/)")
    parser.add_argument("--storage", choices=["float16", "float32"], default=None, help="default: the file's dtype")
    args = parser.parse_args(argv)
    try:
        rows = convert_difftopk(args.file, args.out_dir, args.storage)
    except TopklabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir}: " + ", ".join(f"{split} {n:,} rows" for split, n in rows.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
