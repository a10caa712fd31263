"""The command-line checks read overrides with Hydra's own parser and check every sweep value
before any job runs (in process: no training)."""

import pytest

from helpers import CONFIG_DIR
from topklab.cli import check_group_choices, preflight
from topklab.config import config_groups, override_values, parse_overrides, sweep_points
from topklab.utils.errors import TopklabError

GROUPS = config_groups(CONFIG_DIR)
pytestmark = pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/\w+' is validated against ConfigStore schema")


def values(arg: str) -> list[str]:
    return override_values(parse_overrides([arg])[0], GROUPS)


@pytest.mark.parametrize(
    "arg,expected",
    [
        ("loss=atk,stk", ["atk", "stk"]),
        ("loss.k=range(1,4)", ["1", "2", "3"]),
        ("loss.k=range(0.25,1,0.25)", ["0.25", "0.5", "0.75"]),
        ("loss=glob(*atk)", ["atk", "matk"]),
        ("loss=glob(*,exclude=[*atk,maximum])", ["average", "stk"]),
        ("optim=choice(sgd,adam)", ["sgd", "adam"]),
        ("loss.k=interval(0.1,0.9)", ["0.1", "0.9"]),
        ("+engine.extra=1", ["1"]),
        ("~logger", []),
        ("model@model=linear", ["linear"]),
        ('dataset.root="a,b"', ['"a,b"']),
    ],
)
def test_every_override_form_gives_its_values(arg, expected):
    assert values(arg) == expected


def test_sweep_points_vary_one_key_at_a_time_and_keep_prefixes():
    parsed = parse_overrides(["loss=glob(*atk)", "loss.k=range(1,3)", "+engine.x=1", "~logger", "model@model=mlp"])
    points = sweep_points(parsed, GROUPS)
    assert points == [
        ["loss=atk", "loss.k=1", "+engine.x=1", "~logger", "model@model=mlp"],
        ["loss=matk", "loss.k=1", "+engine.x=1", "~logger", "model@model=mlp"],
        ["loss=atk", "loss.k=2", "+engine.x=1", "~logger", "model@model=mlp"],
    ]


def test_nested_group_options_are_named_by_their_path(tmp_path):
    (tmp_path / "experiment" / "stk" / "table3").mkdir(parents=True)
    (tmp_path / "experiment" / "stk" / "table3" / "german.yaml").write_text("{}\n")
    (tmp_path / "loss").mkdir()
    (tmp_path / "loss" / "stk.yaml").write_text("{}\n")
    assert config_groups(tmp_path) == {"experiment": ["stk/table3/german"], "loss": ["stk"]}
    check_group_choices(["experiment=stk/table3/german"], tmp_path)
    with pytest.raises(TopklabError, match="unknown experiment 'stk/table3/nope'"):
        check_group_choices(["experiment=stk/table3/nope"], tmp_path)


@pytest.mark.parametrize("args", [["loss=atk,nope"], ["loss=choice(stk,nope)"], ["+loss=nope"]])
def test_unknown_group_option_in_any_form(args):
    with pytest.raises(TopklabError, match="unknown loss 'nope'; choose one of: atk, average, matk, maximum, stk$"):
        check_group_choices(args, CONFIG_DIR)


def test_presets_are_a_group_of_train_py():
    check_group_choices(["preset=full", "experiment=stk/table3/german,stk/table3/phoneme"], CONFIG_DIR)
    with pytest.raises(TopklabError, match="unknown preset 'nope'"):
        check_group_choices(["preset=quick,nope"], CONFIG_DIR)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["loss=[1,"], "error: cannot read the override 'loss=[1,' (no viable alternative at input '[1,'); write"),
        (["loss"], "error: cannot read the override 'loss' (missing EQUAL at '<EOF>')"),
        (["-m", "loss=atk,nope"], "error: unknown loss 'nope'; choose one of:"),
        (["loss=atk,stk"], "error: loss=atk,stk is a sweep; add -m to run one job per value"),
        (["-m", "loss=glob(zz*)"], "error: loss=glob(zz*) gives no values; widen the sweep"),
        (["-m", "loss.k=glob(*)"], "error: loss.k=glob(*): glob() selects options of a config group"),
        (["-m", "loss.k=range(0,2)"], "error: loss: k=0 must be a positive count"),  # each range value is composed
        (["-m", "loss=stk", "loss.k=choice(0.5,2.5)"], "error: loss: k=2.5 as a float is a fraction"),
        (["-m", "loss.k=interval(0.1,1)"], "error: loss.k=interval(0.1,1): interval() needs a sweeper that samples"),
        (["hydra/launcher=submitit_lcoal"], "error: In 'hydra/config': Could not find 'hydra/launcher/submitit_lcoal'"),
    ],
)
def test_preflight_errors_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        preflight(argv, CONFIG_DIR)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "loss=glob(*atk)", "loss.k=range(1,3)", "dataset=australian,german"],
        ["-m", "optim=choice(sgd,adam)", "+engine.max_steps=3", "~logger", "hydra/launcher=submitit_local"],
        ["--cfg", "job", "loss=nope"],  # Hydra's own flags: Hydra has the command line
    ],
)
def test_preflight_accepts_every_override_form(capsys, argv):
    preflight(argv, CONFIG_DIR)
    assert capsys.readouterr().err == ""


def test_the_sweepers_glob_reaches_rows_in_subfolders_and_lists_what_the_preflight_checks():
    """Hydra lists a group's top-level options only: under its basic sweeper
    `experiment=glob(sinkhorn_beta/*)` would launch no job. The sweeper train.yaml chooses matches
    every group's options as the preflight does (`config_groups`)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra_plugins.topklab_sweeper import NestedGroupOptions
    from topklab.config import compose_run, config_groups

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        assert compose_run([], return_hydra_config=True).hydra.sweeper._target_.endswith("RowSweeper")
        loader = NestedGroupOptions(GlobalHydra.instance().config_loader())
        parser = OverridesParser.create(config_loader=loader)
        [rows] = parser.parse_overrides(["experiment=glob(sinkhorn_beta/*)"])
        assert list(rows.sweep_string_iterator()) == [f"sinkhorn_beta/beta_{b}" for b in (1, 10, 100, 1000)]
        for group, options in config_groups(CONFIG_DIR).items():
            assert loader.get_group_options(group) == options, group
