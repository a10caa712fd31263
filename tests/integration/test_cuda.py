"""What only a GPU can check: the STk kernels on CUDA against the CPU reference, a PEL row's step
with fp16 autocast and channels-last, and the device-resident image loader on CUDA. Marked ``gpu``:
skipped where no CUDA device is visible."""

import pytest
import torch

from helpers import CONFIG_DIR
from helpers.vision_runs import TINY_VIT, data_overrides
from topklab.engine.run import train
from topklab.losses import MATk, STk
from topklab.losses.aggregate.solve import kth_largest_value
from topklab.tasks.classification_metrics import expected_calibration_error

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cls", [STk, MATk])
@pytest.mark.parametrize("lam_update", ["track", "solve", "gradient"])
def test_the_thresholded_losses_on_cuda_match_the_cpu_in_float64(cls, lam_update):
    """Four training calls on drifting batches: the values, the gradients and the stored (or learned) λ."""
    generator = torch.Generator().manual_seed(0)
    batches = [torch.rand(4097, generator=generator, dtype=torch.float64) * 3 - 0.3 * step for step in range(4)]
    results = {}
    for device in ("cpu", "cuda"):
        aggregate = cls(k=0.9, lam_update=lam_update).double().to(device)  # float64: the CPU's lane, if any, as float64
        results[device] = []
        for losses in batches:
            x = (
                losses.to(device).clone().requires_grad_(True)
            )  # a fresh leaf per device (.to("cpu") is the tensor itself)
            value = aggregate(x)
            value.backward()
            lam = aggregate.threshold.grad if lam_update == "gradient" else aggregate.lam_last
            results[device].append((value.detach().cpu(), x.grad.cpu(), lam.detach().cpu().clone()))
    for on_cpu, on_cuda in zip(results["cpu"], results["cuda"]):
        for a, b in zip(on_cpu, on_cuda):
            torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("cls", [STk, MATk])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_rows_compile_with_inductor_on_cuda_as_one_graph_equal_to_eager(cls, dtype):
    """The library face on a GPU: rows reduced over dim=1 (n = 20,000 each, past the compiled kernel's
    threshold) under torch.compile(fullgraph=True) with inductor's Triton code, against eager on CUDA;
    λ's buffers and the input's gradient agree to the dtype's rounding."""
    torch._dynamo.reset()
    compiled_loss, eager_loss = cls(k=0.3, dim=1).cuda(), cls(k=0.3, dim=1).cuda()
    compiled = torch.compile(lambda values: compiled_loss(values), fullgraph=True)
    generator = torch.Generator().manual_seed(0)
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 1e-3}
    for _ in range(3):  # the first call sets λ from the batch, the next ones warm-start from it
        losses = torch.rand(4, 20_000, generator=generator).mul(3).to("cuda", dtype)
        a, b = losses.clone().requires_grad_(True), losses.clone().requires_grad_(True)
        value_a, value_b = compiled(a), eager_loss(b)
        value_a.float().sum().backward()
        value_b.float().sum().backward()
        assert value_a.dtype == dtype and value_a.shape == (4,)
        torch.testing.assert_close(value_a.float(), value_b.float(), **tolerance)
        torch.testing.assert_close(a.grad.float(), b.grad.float(), **tolerance)
        torch.testing.assert_close(compiled_loss.lam_last, eager_loss.lam_last, **tolerance)


@pytest.mark.parametrize("k", [1, 5, 500_000, 999_996, 1_000_000])
def test_kth_largest_on_cuda_is_the_cpu_kthvalue(k):
    """CUDA takes ℓ_[k] by topk (its kthvalue selects a long row in one block); the value is the CPU's."""
    losses = torch.randn(1_000_000, generator=torch.Generator().manual_seed(0)).round(decimals=2)  # many ties
    assert torch.equal(kth_largest_value(losses.cuda(), k).cpu(), losses.kthvalue(1_000_001 - k).values)


def test_ece_of_cuda_logits_repeats_bit_for_bit():
    """ECE's bin sums must not be atomic float adds, or a resumed run's metrics differ in the last digit."""
    generator = torch.Generator().manual_seed(0)
    logits, labels = (
        torch.randn(200_000, 10, generator=generator),
        torch.randint(0, 10, (200_000,), generator=generator),
    )
    on_cpu = expected_calibration_error(logits, labels)
    on_cuda = {expected_calibration_error(logits.cuda(), labels.cuda()) for _ in range(5)}
    assert len(on_cuda) == 1 and on_cuda.pop() == pytest.approx(on_cpu, rel=1e-12)


@pytest.mark.parametrize("row", ["stk/table5/cifar100lt_stk", "stk/table5/places_lt_atk"])
def test_a_pel_row_trains_on_cuda_with_fp16_autocast(compose_cfg, tmp_path, row, cifar_root, listed_tree):
    cfg = compose_cfg(
        f"experiment={row}",
        *data_overrides(row, cifar_root, listed_tree),
        *TINY_VIT,
        "model.head_init=null",
        "engine.epochs=1",
        "engine.max_steps=2",
        "engine.batch_size=8",
        "engine.micro_batch_size=4",
        "engine.device=cuda",
        "engine.amp=fp16",
        "engine.channels_last=true",
        "engine.progress=false",
        "logger=none",
        "result_file=null",
    )
    summary = train(cfg, tmp_path / "run")
    assert summary["device"].startswith("cuda") and summary["amp"] == "fp16" and summary["steps"] == 2
    assert summary["cost"]["peak_memory_mb"] > 0 and 0 <= summary["metrics"]["test"]["top1"] <= 100


def test_the_device_loader_on_cuda_gives_the_cpu_batches():
    from topklab.data.vision import DeviceLoader

    images = torch.randint(0, 256, (20, 3, 8, 8), dtype=torch.uint8)
    batches = [
        [
            x.cpu()
            for x, _ in DeviceLoader(
                images, torch.arange(20), 8, [0.5] * 3, [0.25] * 3, train=True, device=device
            ).batches(epoch=3)
        ]
        for device in ("cpu", "cuda")
    ]
    assert all(torch.allclose(a, b) for a, b in zip(*batches))


@pytest.mark.parametrize("network", ["odd_even", "bitonic", "splitter_selection"])
def test_diffsortnet_on_cuda_matches_the_cpu_in_float64(network):
    from topklab.operators import DiffSortNet

    scores = torch.randn(8, 37, dtype=torch.float64)
    weights = torch.randn(8, 37, 5, dtype=torch.float64)
    results = []
    for device in ("cpu", "cuda"):
        x = scores.to(device).clone().requires_grad_(True)
        P = DiffSortNet(network, 0.5, "logistic_phi", 0.5).permutation(x, 5)
        (P * weights.to(device)).sum().backward()
        results.append((P.detach().cpu(), x.grad.cpu()))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-12)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-10)


def test_the_default_aggregates_synchronise_with_the_host_only_for_the_out_of_band_check():
    """A host synchronisation per call stalls a GPU step (the library issue's rule for its default path).
    Under CUDA's sync debug mode "warn", 120 training calls of Average, ATk, STk and MATk after their first
    (which starts λ) synchronise at most once: STk's and MATk's check of the out-of-band streak, every
    100th call (the λ monitor's samples, every 50th, stay on the device). Reads that torch's compiler makes
    while it compiles a kernel are one-off and not counted."""
    import re
    import warnings

    from topklab.losses import ATk
    from topklab.losses.aggregate import Average

    compiler = re.compile(r"torch[/\\]_(inductor|dynamo)[/\\]")
    found = {}
    for name, module in [("Average", Average()), ("ATk", ATk(k=0.1)), ("STk", STk(k=0.1)), ("MATk", MATk(k=0.1))]:
        module = module.cuda()
        x = torch.rand(100_000, device="cuda", requires_grad=True)
        module(x).backward()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(120):
                    module(x).backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        # torch's own once-per-process note that the mode is a prototype also says "synchronization"; inductor's
        # constant folding reads a value while it compiles a kernel (MATk's on its second call), once per graph
        found[name] = [
            f"{w.filename}:{w.lineno}"
            for w in caught
            if "called a synchronizing CUDA operation" in str(w.message) and not compiler.search(w.filename)
        ]
    counts = {name: len(messages) for name, messages in found.items()}
    assert counts["Average"] == 0 and counts["ATk"] == 0, found
    assert counts["STk"] <= 1 and counts["MATk"] <= 1, found


OPERATORS = sorted(path.stem for path in (CONFIG_DIR / "operator").glob("*.yaml"))


@pytest.mark.filterwarnings("ignore:SinkhornSort did not converge")
@pytest.mark.parametrize("name", [name for name in OPERATORS if name != "perturbed"])  # CUDA draws other noise
@pytest.mark.parametrize("extremes", [False, True], ids=["finite", "with-infinities"])
def test_every_operator_on_cuda_matches_the_cpu_in_float64(name, extremes):
    """Each configured operator's soft top-k (and permutation), values and gradients, on CUDA against
    the CPU: all-finite rows (on the CPU they take the core alone; on a GPU the masking operators skip
    that check) and rows holding ±inf (the masked core, or the grouped cores)."""
    from omegaconf import OmegaConf

    from topklab.engine.build import build

    scores = torch.randn(5, 12, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    if extremes:
        scores[1, 3], scores[3, 7], scores[3, 8] = torch.inf, -torch.inf, torch.inf
    weights = torch.randn(5, 12, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    results = []
    for device in ("cpu", "cuda"):
        operator = build(OmegaConf.load(CONFIG_DIR / "operator" / f"{name}.yaml"), "operator").to(device)
        x = scores.to(device).clone().requires_grad_(True)
        outputs = [operator.soft_topk(x, 3)]
        if operator.gives_permutation:
            outputs.append(operator.permutation(x, 3))
        loss = sum((out * (weights[..., 0] if out.dim() == 2 else weights).to(device)).nansum() for out in outputs)
        loss.backward()
        results.append([out.detach().cpu() for out in outputs] + [x.grad.cpu()])
    for on_cpu, on_cuda in zip(*results):
        torch.testing.assert_close(on_cuda, on_cpu, rtol=1e-9, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize(("lam_update", "n"), [("track", 100_000), ("solve", 2_000), ("solve", 100_000)])
@pytest.mark.parametrize("cls", [STk, MATk])
def test_a_triton_training_call_is_captured_in_a_cuda_graph(cls, lam_update, n):
    """The Triton training calls read nothing on the host: a forward + backward captured in a CUDA graph
    replays on new losses, λ moving on the device, its value Eq. 5/6 at the λ it used (the monitor's
    sample, a host-side selection every 50th call, left out)."""
    loss = cls(k=0.1, lam_update=lam_update, kernel="triton").cuda()
    loss.monitor.sample_every = 10**9
    static = torch.rand(n, device="cuda", requires_grad=True)
    loss(static).backward()  # the first call starts λ on the torch path
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            static.grad = None
            loss(static).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    static.grad = None
    with torch.cuda.graph(graph):
        value = loss(static)
        value.backward()
    for scale in (2.0, 0.5):
        before = loss.lam_last.clone()
        with torch.no_grad():
            static.copy_(torch.rand(n, device="cuda") * scale)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(value) and torch.isfinite(static.grad).all()
        assert not torch.equal(loss.lam_last, before)
