"""A typo on the command line or in a config ends in one line that names the bad key and the closest
valid ones, and says where the full list is (``--help``), instead of the usage and a dump of the config.

In-process through :func:`lightning_gpate.cli.main` (the parse fails before anything is built); the
subprocess form of the unknown-key case is in ``test_cli_errors.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clitools import tiny_gpate_config
from lightning_gpate.cli import main


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert "usage:" not in captured.out + captured.err
    return lines[0]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return tiny_gpate_config(tmp_path / "tiny.yaml", max_steps=1)


def test_an_unknown_model_option_names_the_closest_one(capsys, config):
    line = _one_line_error(capsys, ["fit", "--config", str(config), "--model.init_args.epsilonn", "5"])
    assert line == ("lightning-gpate fit: error: unknown option model.init_args.epsilonn; did you mean model.init_args.epsilon? "
                    "(see lightning-gpate fit --model.help GPATE)")


def test_an_unknown_option_of_an_option_group_names_the_group_and_its_closest_option(capsys):
    """DP-GAN's ``warm_start`` is a group of options (a dataclass): a typo in it names the whole key and the group's own
    options (it said ``model.init_args.steps``, as if the model had it)."""
    config = str(Path(__file__).resolve().parents[1] / "configs" / "dpgan_digits_minimal.yaml")
    line = _one_line_error(capsys, ["fit", "--config", config, "--model.warm_start.stepz", "5"])
    assert line == ("lightning-gpate fit: error: unknown option model.init_args.warm_start.stepz; did you mean "
                    "model.init_args.warm_start.steps? (see lightning-gpate fit --model.help DPGAN)")


def test_a_typo_in_the_yaml_file_names_the_key_and_the_closest_one(capsys, config):
    text = yaml.safe_load(config.read_text())
    text["model"]["init_args"]["deltaa"] = text["model"]["init_args"].pop("delta")
    config.write_text(yaml.safe_dump(text))
    line = _one_line_error(capsys, ["fit", "--config", str(config)])
    assert "unknown option model.init_args.deltaa; did you mean model.init_args.delta?" in line


def test_a_typo_in_a_yaml_section_names_the_section(capsys, config):
    config.write_text(config.read_text().replace("trainer:", "trainr:"))
    line = _one_line_error(capsys, ["fit", "--config", str(config)])
    assert "unknown option trainr." in line and "did you mean trainer." in line and "(see lightning-gpate fit --help)" in line


def test_a_wrong_type_names_the_key_and_the_type(capsys, config):
    line = _one_line_error(capsys, ["fit", "--config", str(config), "--model.init_args.epsilon", "ten"])
    assert line == "lightning-gpate fit: error: model.init_args.epsilon expects a float, got 'ten' (see lightning-gpate fit --model.help GPATE)"


def test_an_unknown_trainer_flag_names_the_closest_ones(capsys, config):
    line = _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.max_stepz", "5"])
    assert line.startswith("lightning-gpate fit: error: unknown option trainer.max_stepz; did you mean trainer.max_steps")
    assert line.endswith("(see lightning-gpate fit --help)")


def test_a_missing_config_file_names_the_closest_config(capsys, tmp_path):
    (tmp_path / "configs").mkdir()
    tiny_gpate_config(tmp_path / "configs" / "quickstart.yaml")
    line = _one_line_error(capsys, ["fit", "--config", "configs/quickstrat.yaml"])
    assert line == ("lightning-gpate fit: error: config file not found: configs/quickstrat.yaml; did you mean configs/quickstart.yaml? "
                    "(see lightning-gpate fit --help)")


def test_an_unknown_command_names_the_closest_one(capsys):
    line = _one_line_error(capsys, ["fitt", "--config", "x.yaml"])
    assert line.startswith("lightning-gpate fitt: error: unknown command fitt; did you mean fit? (commands: fit, validate, test, predict, ")


def test_help_says_what_the_tool_does(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lightning-gpate ")
    assert "Train differentially private data generators" in out and "lightning-gpate fit --config configs/quickstart.yaml" in out
