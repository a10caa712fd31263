"""Wall time of a training step of the routing rows' language model, dense against routed, side by side.

    python -m benchmarks routing [--capacities 0.125 0.25 0.5] [--repeats 10] [--device cpu|cuda]
                             [--out results/bench/routing_cpu.json] [--quick]

The model of ``experiment=routing/*`` (4 layers, d 256, FFN 1024, 5,000 pieces, layers 1 and 3
routed) takes forward + backward + AdamW steps on two batch shapes of 2,048 tokens: Multi30k-like
(128 sentences × 16 tokens) and long (16 × 128). Per capacity c, the top-k router and the STk
threshold router (λ set to the (1 − c)-quantile of its scores, so that the same fraction passes; a
threshold-p router at that fraction costs the same) are timed in turn with the dense model
(interleaved, warm-up excluded, median of ``--repeats``); the ratio to dense is measured in the same run.
``--quick`` runs the same comparison on a 2-layer d-64 model and one 8 × 16 batch: a check that the
benchmark runs and routes, not a measurement.
"""

from __future__ import annotations

from functools import partial

from benchmarks.harness.isolation import project_root
from benchmarks.harness.output import Measured, json_file
from topklab.utils.errors import TopklabError

ROOT = project_root()
SHAPES = {"multi30k-like (128 x 16)": (128, 16), "long (16 x 128)": (16, 128)}
MODEL = {"vocab_size": 5000, "d_model": 256, "ffn_dim": 1024, "heads": 4, "layers": 4, "dropout": 0.1}
QUICK_SHAPES = {"quick (8 x 16)": (8, 16)}
QUICK_MODEL = {**MODEL, "d_model": 64, "ffn_dim": 128, "heads": 2, "layers": 2}


def make_model(router, device, sizes: dict = MODEL):
    import torch

    from topklab.models import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(**sizes, router=router)
    return model.to(device), torch.optim.AdamW(
        model.parameters(), lr=0.0
    )  # full AdamW work, weights fixed: λ stays calibrated


def training_step(model, optimizer, batch, target):
    """One forward + backward + AdamW step of ``model`` (a callable to time)."""
    import torch.nn.functional as F

    def step():
        logits = model(batch)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1)) + model.auxiliary_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def routed_fraction(model, tokens) -> float:
    """The share of (token, routed layer) pairs the last step sent through the FFN (1 for the dense model)."""
    if not model.last_routed.shape[1]:
        return 1.0
    return float(model.last_routed.sum()) / (tokens[:, :-1].numel() * max(model.last_routed.shape[1], 1))


def arguments(parser) -> None:
    parser.add_argument("--capacities", type=float, nargs="+", default=[0.125, 0.25, 0.5])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=json_file, default=None, help="default: results/bench/routing_<device>.json")
    parser.add_argument(
        "--quick", action="store_true", help="a small model and batch: checks the run, measures nothing"
    )


def measure(args) -> Measured:
    import torch

    from benchmarks.harness import bench_device, device_rows, interleaved, medians, ratios, timed
    from topklab.data.translation import PairBatch
    from topklab.models import STkThresholdRouter, TopKRouter

    device = bench_device(args.device)
    if args.quick and args.out is None:
        raise TopklabError("--quick measures nothing, so it needs --out <file> (results/bench/ keeps measurements)")
    shapes, sizes = (QUICK_SHAPES, QUICK_MODEL) if args.quick else (SHAPES, MODEL)
    rows = []
    for shape, (sentences, length) in shapes.items():
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(4, sizes["vocab_size"], (sentences, length + 1), generator=generator).to(device)
        batch, target = PairBatch(tokens[:, :0], tokens[:, :-1]), tokens[:, 1:]
        variants = {"dense": make_model(None, device, sizes)}
        for c in args.capacities:
            variants[f"top-k, c = {c}"] = make_model(partial(TopKRouter, capacity=c), device, sizes)
            model, optimizer = make_model(partial(STkThresholdRouter, capacity=c), device, sizes)
            for router in model.routers.values():  # in order: λ at the (1 − c)-quantile of its scores on this batch
                seen = []
                hook = router.score.register_forward_hook(
                    lambda module, inputs, output, seen=seen: seen.append(output.detach())
                )
                with torch.no_grad():
                    model(batch)
                hook.remove()
                router.lam.data.fill_(float(seen[0].float().flatten().quantile(1 - c)))
            variants[f"STk threshold, c = {c}"] = (model, optimizer)
        steps = {name: training_step(model, optimizer, batch, target) for name, (model, optimizer) in variants.items()}
        times, _ = interleaved(steps, args.repeats, partial(timed, device=device), warmup=2)
        routed = {name: routed_fraction(model, tokens) for name, (model, _) in variants.items()}  # after the last step
        seconds = medians(times)
        for name, ratio in ratios(seconds, "dense").items():
            rows.append(
                {
                    "shape": shape,
                    "variant": name,
                    "step_seconds": seconds[name],
                    "vs_dense": ratio,
                    "routed_fraction": routed[name],
                }
            )
            print(
                f"{shape:<26} {name:<26} {seconds[name] * 1e3:8.1f} ms  {ratio:.2f}x dense  routed {routed[name]:.3f}",
                flush=True,
            )
    settings = {"capacities": args.capacities, "repeats": args.repeats, "quick": args.quick}
    return device_rows(ROOT, "routing", device, rows, settings, args.out)
