"""DDP building blocks: 2 gloo processes on CPU against one process on the concatenated batch.

One spawn (module fixture) runs every multi-process case and saves what each rank saw; the tests
compare those with single-process references computed here.
"""

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from topklab.engine.distributed import Distributed, all_gather_losses, gather_concat, shard_batch, shard_slice
from topklab.losses import ATk, Average, Logistic, MATk, STk
from topklab.utils.errors import TopklabError

WORLD = 2


def global_batch(n):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 5, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(8, generator=g) < 0.5, -1.0, 1.0).double()
    return x[:n], y[:n]


class Net(nn.Module):
    """Model and aggregate in one module, so that λ is a DDP parameter."""

    def __init__(self, aggregate, gather):
        super().__init__()
        torch.manual_seed(1)
        self.model = nn.Linear(5, 1).double()
        self.aggregate = aggregate.double()
        self.gather = gather

    def forward(self, x, y):
        losses = Logistic()(self.model(x).squeeze(1), y)
        return self.aggregate(all_gather_losses(losses) if self.gather else losses)


# name: (aggregate on each rank, gather the losses?, single-process aggregate, global batch size)
CASES = {
    "average": (lambda: Average(), False, lambda: Average(), 8),
    "matk_fraction": (
        lambda: MATk(k=0.5, lam_update="gradient", lam_init=0.6),
        False,
        lambda: MATk(k=0.5, lam_update="gradient", lam_init=0.6),
        8,
    ),
    "stk_fraction": (
        lambda: STk(k=0.5, delta=0.5, lam_update="gradient", lam_init=0.6),
        False,
        lambda: STk(k=0.5, delta=0.5, lam_update="gradient", lam_init=0.6),
        8,
    ),
    "stk_fraction_atk_scale": (
        lambda: STk(k=0.25, lam_update="gradient", lam_init=0.6, scale="atk"),
        False,
        lambda: STk(k=0.25, lam_update="gradient", lam_init=0.6, scale="atk"),
        8,
    ),
    # k·m not whole: each rank rounds 0.375·4 = 1.5 up to 2, so the run is the global objective with k = 0.5
    "stk_fraction_rounded": (
        lambda: STk(k=0.375, lam_update="gradient", lam_init=0.6),
        False,
        lambda: STk(k=0.5, lam_update="gradient", lam_init=0.6),
        8,
    ),
    # a count without gathering is a count per rank: 2 on each of 2 ranks is 4 of the global batch
    "matk_count_local": (
        lambda: MATk(k=2, lam_update="gradient", lam_init=0.6),
        False,
        lambda: MATk(k=4, lam_update="gradient", lam_init=0.6),
        8,
    ),
    "atk_gathered": (lambda: ATk(k=0.25), True, lambda: ATk(k=0.25), 8),
    "atk_local": (lambda: ATk(k=0.25), False, lambda: ATk(k=0.25), 8),
    # with gathering a count is a count of the global batch, and λ is exact too
    "matk_count_gathered": (
        lambda: MATk(k=3, lam_update="gradient", lam_init=0.6),
        True,
        lambda: MATk(k=3, lam_update="gradient", lam_init=0.6),
        8,
    ),
    # uneven split (4 + 3 samples): exact with gathering
    "atk_gathered_uneven": (lambda: ATk(k=3), True, lambda: ATk(k=3), 7),
}


def _worker(rank, store, out_dir):
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    ctx = Distributed.from_env(backend="gloo").init(init_method=f"file://{store}", timeout=timedelta(seconds=60))
    seen = {"rank": ctx.rank, "is_main": ctx.is_main}
    for name, (make_aggregate, gather, _, n) in CASES.items():
        x, y = global_batch(n)
        mine = shard_batch(torch.arange(n), ctx.rank, ctx.world_size, uneven="split")
        net = ctx.wrap(Net(make_aggregate(), gather))
        loss = net(x[mine], y[mine])
        loss.backward()
        seen[name] = {"loss": loss.detach(), "grads": [p.grad.clone() for p in net.parameters()]}

    rows = torch.arange(6).reshape(3, 2) if rank == 0 else torch.tensor([[10, 11]])
    seen["rows"] = gather_concat(rows)
    seen["empty_rank"] = gather_concat(torch.tensor([1.0, 2.0]) if rank == 0 else torch.empty(0))
    evaluation_set = torch.arange(7) * 1.5
    seen["eval"] = gather_concat(evaluation_set[shard_slice(7, ctx.rank, ctx.world_size)])
    try:
        gather_concat(torch.zeros(2, 3 if rank == 0 else 2))
    except TopklabError as error:
        seen["shape_error"] = str(error)
    ctx.barrier()
    ctx.close()
    torch.save(seen, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(str(out / "store"), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def single_process(name):
    _, _, make_reference, n = CASES[name]
    net = Net(make_reference(), gather=False)
    loss = net(*global_batch(n))
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in net.parameters()]


@pytest.mark.integration  # the 2-process spawn (module fixture ranks)
@pytest.mark.parametrize(
    "name",
    [
        "average",
        "matk_fraction",
        "stk_fraction",
        "stk_fraction_atk_scale",
        "stk_fraction_rounded",
        "matk_count_local",
        "atk_gathered",
        "matk_count_gathered",
        "atk_gathered_uneven",
    ],
)
def test_ddp_gradient_equals_single_process_on_the_global_batch(ranks, name):
    _, reference = single_process(name)
    for seen in ranks:
        for got, want in zip(seen[name]["grads"], reference, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.integration  # the 2-process spawn (module fixture ranks)
@pytest.mark.parametrize("name", ["atk_gathered", "matk_count_gathered", "atk_gathered_uneven"])
def test_gathered_loss_is_the_global_value_on_every_rank(ranks, name):
    value, _ = single_process(name)
    for seen in ranks:
        torch.testing.assert_close(seen[name]["loss"], value, rtol=1e-12, atol=0)


@pytest.mark.integration  # the 2-process spawn (module fixture ranks)
def test_atk_without_gathering_is_not_the_global_atk(ranks):
    _, reference = single_process("atk_local")
    weight_gap = (ranks[0]["atk_local"]["grads"][0] - reference[0]).abs().max()
    assert weight_gap > 1e-2  # the mean of the local top-1 losses is not the global top-2 mean
    torch.testing.assert_close(ranks[0]["atk_local"]["grads"], ranks[1]["atk_local"]["grads"])  # but DDP synced


@pytest.mark.integration  # the 2-process spawn (module fixture ranks)
def test_gather_concat_uneven_rows_in_rank_order(ranks):
    for seen in ranks:
        assert torch.equal(seen["rows"], torch.tensor([[0, 1], [2, 3], [4, 5], [10, 11]]))
        assert torch.equal(seen["empty_rank"], torch.tensor([1.0, 2.0]))
        assert torch.equal(seen["eval"], torch.arange(7) * 1.5)
        assert "all dimensions but the first must agree" in seen["shape_error"]
    assert [seen["rank"] for seen in ranks] == [0, 1] and [seen["is_main"] for seen in ranks] == [True, False]


# ---------- one process ----------


def test_single_process_is_a_no_op():
    ctx = Distributed.from_env({})
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.is_distributed) == (0, 1, True, False)
    assert ctx.init() is ctx and not dist.is_initialized()
    ctx.barrier()
    ctx.close()
    model = nn.Linear(2, 1)
    assert ctx.wrap(model) is model
    losses = torch.tensor([1.0, 3.0], requires_grad=True)
    assert all_gather_losses(losses) is losses and gather_concat(losses) is losses
    world_one = Distributed.from_env({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}, backend="gloo")
    assert world_one == Distributed()


def test_from_env_reads_torchrun_variables():
    ctx = Distributed.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, backend="gloo")
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.is_main, ctx.device) == (3, 4, 1, False, torch.device("cpu"))


@pytest.mark.parametrize(
    "environ,expected",
    [
        ({"WORLD_SIZE": "2"}, "RANK is not set"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "LOCAL_RANK is not set"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' must be a whole number"),
        ({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"}, "rank=2 with world_size=2 is impossible"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 must be a whole number >= 0"),
    ],
)
def test_incomplete_or_wrong_env_is_one_line_error(environ, expected):
    with pytest.raises(TopklabError, match=expected) as error:
        Distributed.from_env(environ, backend="gloo")
    assert "\n" not in str(error.value)


def test_init_without_rendezvous_address_says_how_to_launch(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(TopklabError, match="MASTER_ADDR and MASTER_PORT not set; launch with torchrun"):
        Distributed(rank=0, world_size=2).init()
    assert not dist.is_initialized()
    with pytest.raises(TopklabError, match="unknown DDP backend 'mpi'"):
        Distributed(backend="mpi")


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shard_batch_chunks_concatenate_to_the_global_batch(world_size):
    batch = torch.randperm(12, generator=torch.Generator().manual_seed(world_size))
    chunks = [shard_batch(batch, r, world_size) for r in range(world_size)]
    assert torch.equal(torch.cat(chunks), batch)
    assert {len(c) for c in chunks} == {12 // world_size}


def test_shard_batch_uneven_policies():
    with pytest.raises(TopklabError, match="global batch of 7 samples does not split evenly over world size 2"):
        shard_batch(list(range(7)), 0, 2)
    assert [shard_batch(list(range(7)), r, 2, uneven="drop") for r in range(2)] == [[0, 1, 2], [3, 4, 5]]
    assert [shard_batch(list(range(7)), r, 2, uneven="split") for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6]]
    assert [shard_batch(list(range(3)), r, 4, uneven="drop") for r in range(4)] == [[], [], [], []]
    with pytest.raises(TopklabError, match="unknown uneven='pad'"):
        shard_batch([0, 1], 0, 2, uneven="pad")
    with pytest.raises(TopklabError, match="rank=2 with world_size=2 is impossible"):
        shard_batch([0, 1], 2, 2)


@pytest.mark.parametrize("n,world_size", [(10, 4), (3, 4), (0, 2), (9, 3)])
def test_shard_slice_covers_the_set_in_order(n, world_size):
    slices = [shard_slice(n, r, world_size) for r in range(world_size)]
    covered = [i for s in slices for i in range(n)[s]]
    assert covered == list(range(n))
    assert max(s.stop - s.start for s in slices) - min(s.stop - s.start for s in slices) <= 1
