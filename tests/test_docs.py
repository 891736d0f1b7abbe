"""The documentation a user reads: the short README and the ``docs/`` pages it links to.

Nothing the split moved out of the README may get lost (every config is documented, links resolve),
the commands a user and CI copy stay as they are, and the documented error examples are what the
command line prints.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))

INSTALL_AND_QUICKSTART = "pip install -c constraints.txt -e . && lightning-gpate fit --config configs/quickstart.yaml"
TEST_COMMAND = 'pip install -c constraints.txt -e ".[test]" && python -m pytest -q'
README_MAX_LINES = 170  # read in five minutes; the reference lives in docs/


def _all_docs() -> str:
    return "\n".join(page.read_text() for page in [README, *DOC_PAGES])


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)


def test_every_config_is_documented():
    docs = _all_docs()
    configs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.yaml"))
    assert configs
    undocumented = [c for c in configs if c not in docs]
    assert not undocumented, f"configs named nowhere in README.md or docs/*.md: {undocumented}"


def test_readme_keeps_the_install_quickstart_and_test_commands():
    blocks = [block.strip() for block in _code_blocks(README.read_text())]
    assert INSTALL_AND_QUICKSTART in blocks
    assert TEST_COMMAND in blocks
    ci = (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command
    install, run_tests = TEST_COMMAND.split(" && ")
    assert install.replace("pip install", "pip install -q") in ci and run_tests in ci


#: The README's results: where we stand, read in a minute; the rest is one link away (docs/results.md).
README_RESULTS_MAX_LINES = 40


def test_the_readme_s_results_are_read_in_a_minute_and_link_to_the_rest():
    text = README.read_text()
    section = re.search(r"^## Results\n(.*?)(?=^## )", text, re.M | re.S).group(0)
    assert len(section.splitlines()) <= README_RESULTS_MAX_LINES, len(section.splitlines())
    assert "](docs/results.md" in section and section.count("\n|---") >= 2  # the rest one link away; the tables kept


def test_readme_is_short_and_links_to_every_doc_page():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = set(re.findall(r"\]\((docs/[^)#]+)", text))
    unlinked = [p.relative_to(ROOT).as_posix() for p in DOC_PAGES if p.relative_to(ROOT).as_posix() not in linked]
    assert not unlinked, f"docs pages the README does not link to: {unlinked}"


@pytest.mark.parametrize("page", [README, *DOC_PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_and_images_resolve(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        assert (page.parent / path).exists(), f"{page.name} links to {target}, which does not exist"


def _documented_errors() -> list[tuple[str, str]]:
    """The ``$ lightning-gpate ...`` examples of docs/errors-and-resume.md and the line printed under each."""
    text = (ROOT / "docs" / "errors-and-resume.md").read_text()
    pairs = []
    for block in _code_blocks(text):
        lines = block.strip().splitlines()
        pairs += [(lines[i][2:], lines[i + 1]) for i in range(len(lines) - 1) if lines[i].startswith("$ lightning-gpate ")]
    return pairs


def test_the_error_examples_are_documented():
    assert len(_documented_errors()) >= 3


@pytest.mark.parametrize("command,printed", _documented_errors(), ids=lambda v: v.split()[1] if " " in v else v)
def test_documented_error_examples_are_what_the_cli_prints(command, printed, tmp_path, monkeypatch, capsys):
    from lightning_gpate.cli import main

    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "notes.txt").write_text("this is not a checkpoint\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    argv = shlex.split(command)
    assert argv[0] == "lightning-gpate"
    assert main(argv[1:]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    # "..." in the documentation stands for the rest of a long list
    pattern = ".*".join(re.escape(part) for part in printed.split("..."))
    assert re.fullmatch(pattern, last), (printed, last)


def test_every_committed_picture_is_shown_somewhere_and_small():
    docs = _all_docs()
    pictures = sorted((ROOT / "docs" / "img").glob("*.png"))
    assert pictures
    for picture in pictures:
        assert f"img/{picture.name}" in docs, f"{picture.name} is shown on no page"
        assert picture.stat().st_size <= 300_000, f"{picture.name} is {picture.stat().st_size // 1000} KB"


def test_the_tabular_walkthrough_runs_as_written(capsys):
    """docs/tabular.md's walkthrough, block by block, in the test's own folder and MLflow store (the autouse fixture):
    a CSV, its schema, a MarginalTree fit at ε = 1 (with its quantile bins), samples, the report, compare."""
    from lightning_gpate.cli import main

    text = (ROOT / "docs" / "tabular.md").read_text()
    section = text.split("## Walkthrough", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(python|bash)\n(.*?)```", section, flags=re.S)
    assert [kind for kind, _ in blocks] == ["python"] * 5 + ["bash"]
    namespace: dict = {}
    for kind, code in blocks:
        if kind == "python":
            exec(compile(code, "docs/tabular.md", "exec"), namespace)
        else:
            args = shlex.split(code.strip())
            assert args[0] == "lightning-gpate" and main(args[1:]) == 0
    out = capsys.readouterr().out
    assert "lightning-gpate fit: done" in out and "values: worst column" in out and "my-table" not in out.split("fit: done")[0]
    assert "AUROC synthetic→real" in out and "median of mean area: real" in out
    synthetic = namespace["synthetic"]
    assert len(synthetic) == 1000 and list(synthetic.columns) == list(namespace["frame"].columns)
    assert namespace["synth"].model.data_spec["columns"][2]["edges_source"] == "log"
    assert namespace["synth"].model.data_spec["columns"][0]["edges_source"] == "dp_quantiles"
