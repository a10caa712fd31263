"""Every option of every config group composes and instantiates (lightning-hydra-template style),
and each dataset's recipe gives each kind of dataset sensible groups that the command line can override."""

import re

import pytest
import torch
from hydra.utils import instantiate

from helpers import CONFIG_DIR
from topklab.config import config_groups
from topklab.data.translation import PairBatch
from topklab.engine.build import build, build_for_data
from topklab.utils.errors import TopklabError

FAKE_DATA = {
    "in_features": 3,
    "in_channels": 3,
    "num_classes": 10,
    "class_counts": [50, 30, 20, 10, 8, 6, 5, 4, 3, 2],
    "shot_counts": [50, 30, 20, 10, 8, 6, 5, 4, 3, 2],
    "target": "binary",
    "vocab_size": 40,
    "pad_id": 0,
    "vocab": None,
    "class_names": [f"class {c}" for c in range(10)],
}
# offline, the pre-trained backbones are built with random weights at a small input size
OFFLINE_WEIGHTS = {"model.pretrained": "false", "model.img_size": "32", "model.head_init.pretrained": "null"}

# the vision rows of STk Tables 5, 7, 8 are composed, built and run one step each in tests/integration/test_pel_rows.py, the
# ImageNet-embedding rows of Petersen et al.'s Tables 2, 3, 5 in tests/integration/test_embedding_rows.py
SEPARATELY_TESTED_ROWS = (
    "stk/table5/",
    "stk/table7/",
    "stk/table8/",
    "petersen/imagenet1k/",
    "petersen/imagenet21kp/",
    "petersen/table5/",
)
GROUP_OPTIONS = [
    (group, option)
    for group, options in config_groups(CONFIG_DIR).items()
    for option in options
    if not option.rsplit("/", 1)[-1].startswith("_")
    and not (group == "experiment" and option.startswith(SEPARATELY_TESTED_ROWS))
    and group not in ("operator", "gradient_exchange", "router")
    and (group, option)
    != ("recipe", "auto")  # the placeholder a dataset replaces: test_a_dataset_that_chooses_no_recipe_is_refused
]
# operators are placed inside a loss (operator@individual.operator=<name>): test_every_operator_composes;
# gradient exchanges inside the engine (gradient_exchange@engine.gradient_exchange=<name>): test_every_gradient_exchange;
# routers inside the language model (router@model.router=<name>): test_every_router_composes
OPERATORS = sorted(path.stem for path in (CONFIG_DIR / "operator").glob("*.yaml"))
EXCHANGES = sorted(path.stem for path in (CONFIG_DIR / "gradient_exchange").glob("*.yaml"))
ROUTERS = sorted(path.stem for path in (CONFIG_DIR / "router").glob("*.yaml"))


def test_there_is_something_to_compose():
    groups = dict(config_groups(CONFIG_DIR))
    for group in (
        "dataset",
        "model",
        "loss",
        "individual",
        "optim",
        "engine",
        "task",
        "recipe",
        "logger",
        "experiment",
    ):
        assert groups.get(group), f"config group {group} is empty"


@pytest.mark.integration
@pytest.mark.parametrize("group,option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_compose_and_instantiate(compose_cfg, composed_rows, group, option):
    cfg = composed_rows[option] if group == "experiment" else compose_cfg(f"{group}={option}")
    if cfg.model.get("pretrained"):
        offline = [
            f"{k}={v}"
            for k, v in OFFLINE_WEIGHTS.items()
            if k != "model.head_init.pretrained" or "pretrained" in (cfg.model.head_init or {})
        ]
        cfg = compose_cfg(f"{group}={option}", *offline)
    assert cfg[group] is not None if group not in ("recipe", "experiment") else cfg.recipe != "auto"
    dataset = build(cfg.dataset, "dataset")
    build(cfg.tuner, "tuner")
    build_for_data(cfg.model, "model", FAKE_DATA)
    build(cfg.loss, "loss")
    build_for_data(cfg.individual, "individual", FAKE_DATA)
    build(cfg.engine, "engine")
    build_for_data(cfg.task, "task", FAKE_DATA)
    build(cfg.logger, "logger")
    optimizer_factory = instantiate(cfg.optim)
    assert callable(optimizer_factory)
    assert dataset.task in ("binary", "regression", "multiclass", "translation", "language_modeling", "embeddings")


@pytest.mark.parametrize("option", OPERATORS)
def test_every_operator_composes_into_the_topk_ce_and_runs(compose_cfg, option):
    cfg = compose_cfg("dataset=fmnistlt", "individual=topk_ce", f"operator@individual.operator={option}")
    operator = build(cfg.individual.operator, "operator")
    scores, targets = torch.randn(4, 10), torch.tensor([0, 3, 9, 2])
    soft = operator.soft_topk(scores, 3)
    assert soft.shape == (4, 10) and torch.isfinite(soft).all() and (soft >= -1e-6).all()  # NeuralSort may exceed 1
    if operator.sums_to_k:
        assert torch.allclose(soft.sum(1), torch.full((4,), 3.0), atol=1e-4)
    if operator.gives_permutation:
        assert operator.permutation(scores, 3).shape == (4, 10, 3)
        loss = build_for_data(cfg.individual, "individual", FAKE_DATA)
        assert loss(scores, targets).shape == (4,)
    else:
        with pytest.raises(TopklabError, match="needs an operator that gives a top-k permutation"):
            build_for_data(cfg.individual, "individual", FAKE_DATA)


@pytest.mark.parametrize("option", EXCHANGES)
def test_every_gradient_exchange_composes_into_the_engine_and_exchanges(compose_cfg, option):
    cfg = compose_cfg("dataset=fmnistlt", f"gradient_exchange@engine.gradient_exchange={option}")
    exchange = build(cfg.engine, "engine").gradient_exchange
    weight = torch.nn.Parameter(torch.zeros(1000))
    exchange.attach([weight])
    draws = torch.Generator().manual_seed(0)
    for worker in range(exchange.workers):
        weight.grad = torch.randn(1000, generator=draws)
        exchange.collect(worker)
    exchange.apply()
    sent = int((weight.grad != 0).sum())
    seen = f"sent {sent} of 1000, k {exchange.k}, workers {exchange.workers}, gradient dtype {weight.grad.dtype}"
    assert sent == 1000 if exchange.keep_ratio == 1 else 0 < sent <= exchange.workers * 1.3 * exchange.k, seen


@pytest.mark.parametrize("option", ROUTERS)
def test_every_router_composes_into_the_language_model_and_routes(compose_cfg, option):
    cfg = compose_cfg(
        "dataset=multi30k_en",
        "model=transformer_lm",
        f"router@model.router={option}",
        "model.d_model=16",
        "model.ffn_dim=32",
        "model.heads=2",
        "model.layers=2",
    )
    model = build_for_data(cfg.model, "model", FAKE_DATA).eval()
    assert list(model.routers) == ["1"]
    tokens = torch.randint(1, FAKE_DATA["vocab_size"], (3, 16))
    logits = model(PairBatch(tokens[:, :0], tokens))
    assert logits.shape == (3, 16, FAKE_DATA["vocab_size"]) and torch.isfinite(logits).all()
    assert model.last_routed.shape == (3, 1) and int(model.last_routed.max()) <= 16


@pytest.mark.parametrize(
    "dataset,recipe,model,individual,engine_select",
    [
        ("australian", "binary", "MLP", "Logistic", None),
        ("housing", "regression", "MLP", "Square", None),
        ("cifar100", "multiclass", "resnet32", "LogitAdjusted", ["top1"]),
        ("cifar100lt", "multiclass", "resnet32", "LogitAdjusted", ["top1"]),
        ("fmnistlt", "multiclass", "resnet32", "LogitAdjusted", ["top1"]),
        ("multi30k", "translation", "Transformer", "LabelSmoothedCrossEntropy", ["bleu"]),
        ("wmt17", "translation", "Transformer", "LabelSmoothedCrossEntropy", ["bleu"]),
        ("imagenet1k_embeddings", "embeddings", "EmbeddingHead", "CrossEntropy", ["top1", "top5"]),
    ],
)
def test_recipe_follows_the_dataset_task(compose_cfg, dataset, recipe, model, individual, engine_select):
    cfg = compose_cfg(f"dataset={dataset}")
    assert cfg.recipe == recipe
    assert cfg.model._target_.endswith(model) and cfg.individual._target_.endswith(individual)
    assert cfg.engine.select_metrics == engine_select


def test_command_line_choices_win_over_the_recipe(compose_cfg):
    cfg = compose_cfg(
        "dataset=cifar100lt", "loss=stk", "model=resnet18_cifar", "individual=cross_entropy", "optim=adam"
    )
    assert cfg.model._target_.endswith("resnet18_cifar") and cfg.optim._target_ == "torch.optim.Adam"
    assert cfg.individual._target_.endswith("CrossEntropy") and cfg.loss._target_.endswith("STk")
    assert compose_cfg("dataset=housing", "individual=absolute").individual._target_ == "topklab.losses.Absolute"
    assert compose_cfg("dataset=cifar100lt", "recipe=binary").model._target_.endswith("MLP")


def test_a_group_option_describes_only_itself():
    """Couplings live in recipes and experiment rows, not in dataset/model/loss/... options; a
    dataset's one coupling is the recipe of its own task."""
    for group in ("dataset", "model", "loss", "individual", "optim", "engine", "task", "logger"):
        for path in (CONFIG_DIR / group).glob("*.yaml"):
            text = path.read_text()
            if group == "dataset":
                task = re.search(r"^task: (\w+)", text, re.M)
                recipe = re.findall(r"^  - override /recipe@_group_: (\w+)", text, re.M)
                assert recipe == ([task.group(1)] if task else []), f"{path.name}: its recipe is not its task's"
                text = re.sub(r"^  - override /recipe@_group_: \w+", "", text, flags=re.M)
            assert "override /" not in text, f"{group}/{path.name} sets another group"


@pytest.mark.parametrize("dataset", config_groups(CONFIG_DIR)["dataset"])
def test_every_dataset_chooses_the_recipe_of_its_task(compose_cfg, dataset):
    cfg = compose_cfg(f"dataset={dataset}")
    assert cfg.recipe == cfg.dataset.task


def test_a_dataset_that_chooses_no_recipe_is_refused(compose_cfg):
    with pytest.raises(
        TopklabError,
        match=r"^dataset topklab.data.vision.CIFAR100 chooses no recipe: add `defaults: \[override /recipe",
    ):
        compose_cfg("dataset=cifar100lt", "recipe=auto")
    assert compose_cfg("dataset=cifar100lt", "recipe=none").model._target_.endswith("MLP")


def test_fields_of_recipe_chosen_groups_can_be_overridden(compose_cfg):
    cfg = compose_cfg("dataset=cifar100lt", "optim.momentum=0.8", "engine.schedule.warmup_epochs=5", "individual.tau=2")
    assert cfg.optim.momentum == 0.8 and cfg.engine.schedule.warmup_epochs == 5 and cfg.individual.tau == 2


@pytest.mark.parametrize(
    "row,operator",
    [
        (
            "petersen/cifar100/diffsortnets_uniform",
            {
                "_target_": "topklab.operators.DiffSortNet",
                "network": "bitonic",
                "steepness": 0.5,
                "distribution": "logistic_phi",
                "art_lambda": 0.5,
            },
        ),
        ("petersen/cifar100/neuralsort_top5", {"_target_": "topklab.operators.NeuralSort", "tau": 16.0}),
        ("petersen/cifar100/softsort_uniform", {"_target_": "topklab.operators.SoftSort", "tau": 16.0, "power": 1.0}),
        (
            "petersen/cifar100/sinkhorn_top5",
            {
                "_target_": "topklab.operators.SinkhornSort",
                "inverse_temperature": 100.0,
                "iterations": 50,
                "tol": 1e-3,
                "unconverged": "warn",
            },
        ),
        (
            "fmnistlt/topk_ce",
            {
                "_target_": "topklab.operators.DiffSortNet",
                "network": "odd_even",
                "steepness": 0.5,
                "distribution": "logistic_phi",
                "art_lambda": 0.5,
            },
        ),
    ],
)
def test_topk_ce_rows_get_petersens_operator_settings_and_can_swap_the_operator(compose_cfg, row, operator):
    """The rows take their operator's config defaults (Petersen et al.'s CIFAR-100 settings), so that
    operator@individual.operator=<name> swaps the whole operator."""
    assert dict(compose_cfg(f"experiment={row}", "result_file=null").individual.operator) == operator
    swapped = compose_cfg(f"experiment={row}", "result_file=null", "operator@individual.operator=lapsum")
    assert build_for_data(swapped.individual, "individual", FAKE_DATA).operator.__class__.__name__ == "LapSum"
