"""The command line's help as a new user reads it: plain sentences, a model's description and its options on a screen
or two, every model named, nothing the user never sets."""

from __future__ import annotations

import re

import pytest

from lightning_gpate.api import model_classes
from lightning_gpate.cli import MODEL_TITLES, main
from lightning_gpate.helptext import first_sentence, plain_text

#: What a help must not print: reStructuredText's literals and roles, the project's issue numbers, benchmark paths.
MARKUP = re.compile(r"``|:[a-z]+:`|`_")
HISTORY = re.compile(r"\b[Ii]ssues? \d+|benchmarks/|results/\w+\.md|_notes\.md|_ladder\w*\.md")
#: The longest a model's --model.help may be, in lines of an 80-column terminal.
MAX_MODEL_HELP_LINES = 120


def _help(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0, capsys.readouterr()
    return capsys.readouterr().out


@pytest.fixture
def terminal_80(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


@pytest.mark.parametrize("model", sorted(cls.__name__ for cls in model_classes().values()))
def test_a_model_s_help_is_plain_text_on_a_screen_or_two(capsys, terminal_80, model):
    out = _help(capsys, ["fit", "--model.help", model])
    lines = out.splitlines()
    assert len(lines) <= MAX_MODEL_HELP_LINES, f"{model}: {len(lines)} lines"
    assert not MARKUP.search(out), MARKUP.search(out).group(0)
    assert not HISTORY.search(out), HISTORY.search(out).group(0)
    assert "data_spec" not in out  # set by the command line itself, never by the user
    assert lines[0] == f"usage: lightning-gpate fit --model {model} [--model.OPTION VALUE ...]"
    # the description is the class docstring's whole first paragraph, a complete sentence
    description = " ".join(lines[2:lines.index("", 2)])
    assert description.endswith((".", ")")) and len(description) > 40, description
    assert f"{model}'s options:" in lines
    assert "--model.epsilon" in out or model == "GAN"
    assert max(len(line) for line in lines) <= 80


def test_the_tool_s_help_names_every_model(capsys, terminal_80):
    assert set(MODEL_TITLES) == {cls.__name__ for cls in model_classes().values()}
    out = " ".join(_help(capsys, ["--help"]).split())
    for title in MODEL_TITLES.values():
        assert title in out, title
    assert "DP-MERF" in out
    fit = " ".join(_help(capsys, ["fit", "--help"]).split())
    assert all(name in fit for name in MODEL_TITLES)  # the --model option lists them by the names it takes
    assert not MARKUP.search(fit) and not HISTORY.search(fit), (MARKUP.search(fit) or HISTORY.search(fit)).group(0)
    assert "data_spec" not in fit and "Linked arguments" not in fit
    assert "--trainer.max_steps" in fit and "the model:" in fit


def test_a_group_s_help_is_reachable_from_the_model_s(capsys, terminal_80):
    out = _help(capsys, ["fit", "--model.help", "GPATE"])
    assert "--model.aggregator.help NAME" in out and "--model.warm_start.help" in out
    group = _help(capsys, ["fit", "--model.help", "GPATE", "--model.warm_start.help"])
    assert "--model.warm_start.fraction" in group and not MARKUP.search(group)
    data = _help(capsys, ["fit", "--data.help", "TabularDataModule"])
    assert "--data.frame" not in data and "--data.label" in data and not MARKUP.search(data)


def test_plain_text_shows_what_markup_means_and_the_summary_is_one_sentence():
    assert plain_text("the ``GaussAgg`` aggregator (:class:`~lightning_gpate.privacy.GaussAgg`)") == "the GaussAgg aggregator (GaussAgg)"
    assert plain_text(":func:`lightning_gpate.privacy.merf.fourier_frequencies`") == "fourier_frequencies"
    assert plain_text("see `the docs <https://example.org>`_, **not** *this*; keep private/*") == \
        "see the docs (https://example.org), not this; keep private/*"
    assert plain_text("``x``\n    over two lines") == "x over two lines"
    assert first_sentence("seed of the noise (e.g. 3. not secret). null: from the OS. More.") == "seed of the noise (e.g. 3. not secret)."
    assert first_sentence("Yoon et al. 2019, Algorithm 1. The rest.") == "Yoon et al. 2019, Algorithm 1."
    assert first_sentence("no full stop") == "no full stop"


def test_evaluate_s_help_says_which_split_sets_the_default_sample_size(capsys, terminal_80):
    out = " ".join(_help(capsys, ["evaluate", "--help"]).split())
    assert "as many as the real test split for a private model" in out
