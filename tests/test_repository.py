"""The repository's own rules: notebooks without outputs and with papermill parameters, pins in step."""
import json
import re
from pathlib import Path

import papermill
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no experiment notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path):
    cells = json.loads(path.read_text())["cells"]
    dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{path.name}: code cells {dirty} hold outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_scale_and_device_parameters(path):
    params = papermill.inspect_notebook(str(path))
    assert {"scale", "device"} <= set(params), f"{path.name}: parameters cell declares {sorted(params)}"
    assert params["scale"]["default"].strip("'\"") in ("smoke", "cpu", "gpu")
    assert params["device"]["default"].strip("'\"") in ("auto", "cpu", "cuda")


def pin_problems(project: dict, environment: dict) -> list[str]:
    """What breaks the pinning rule: every requirement of pyproject.toml (dependencies and every extra) is
    ``name==version``, and environment.yml's pip section pins exactly the same (and installs the project itself,
    ``-e .``), under python 3.11."""
    problems, wanted = [], {}
    for req in [*project.get("dependencies", []), *(r for extra in project.get("optional-dependencies", {}).values()
                                                   for r in extra)]:
        m = PIN.fullmatch(req)
        if not m:
            problems.append(f"pyproject.toml: {req!r} is not pinned with ==")
            continue
        wanted[m.group(1).lower()] = m.group(2)
    deps = environment.get("dependencies", [])
    if "python=3.11" not in [d for d in deps if isinstance(d, str)]:
        problems.append("environment.yml: python=3.11 is missing")
    pip = next((d["pip"] for d in deps if isinstance(d, dict) and "pip" in d), [])
    pinned = {}
    for req in (r for r in pip if r != "-e ."):  # the project itself, installed editable
        m = PIN.fullmatch(req)
        if not m:
            problems.append(f"environment.yml: {req!r} is not pinned with ==")
            continue
        pinned[m.group(1).lower()] = m.group(2)
    for name in sorted(set(wanted) | set(pinned)):
        if wanted.get(name) != pinned.get(name):
            problems.append(f"{name}: pyproject.toml pins {wanted.get(name)}, environment.yml {pinned.get(name)}")
    return problems


PIN = re.compile(r"\s*([A-Za-z0-9_.\-]+(?:\[[A-Za-z0-9_,\-]+\])?)\s*==\s*([^\s;]+)\s*")


def test_environment_yml_pins_what_pyproject_pins():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert pin_problems(project, yaml.safe_load((ROOT / "environment.yml").read_text())) == []


def test_the_pin_check_finds_each_kind_of_problem():
    env = {"dependencies": ["python=3.11", {"pip": ["torch==2.13.0", "numpy==2.0.0"]}]}
    assert pin_problems({"dependencies": ["torch==2.13.0", "numpy==2.0.0"]}, env) == []
    assert pin_problems({"dependencies": ["torch==2.13.0", "numpy>=2"]}, env) == [
        "pyproject.toml: 'numpy>=2' is not pinned with ==", "numpy: pyproject.toml pins None, environment.yml 2.0.0"]
    assert pin_problems({"dependencies": ["torch==2.13.0"], "optional-dependencies": {"book": ["numpy==2.1.0"]}},
                        env) == ["numpy: pyproject.toml pins 2.1.0, environment.yml 2.0.0"]
    assert pin_problems({"dependencies": ["torch==2.13.0", "numpy==2.0.0"]},
                        {"dependencies": ["python=3.12", {"pip": ["torch==2.13.0", "numpy"]}]}) == [
        "environment.yml: python=3.11 is missing", "environment.yml: 'numpy' is not pinned with ==",
        "numpy: pyproject.toml pins 2.0.0, environment.yml None"]


def test_toc_lists_existing_chapters():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    missing = [f for f in files if not any((ROOT / f).with_suffix(s).exists() for s in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml names missing files: {missing}"


CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))
CELL = re.compile(r"```\{code-cell\}[^\n]*\n(.*?)```", re.S)


def code_cells(text: str) -> list[list[str]]:
    """The non-blank code lines of each code cell of a MyST chapter (cell options such as ``:tags:`` left out)."""
    return [[line for line in cell.splitlines() if line.strip() and not line.startswith(":")]
            for cell in CELL.findall(text)]


def test_code_cells_are_read_from_a_chapter():
    cells = code_cells("text\n```{code-cell} ipython3\n:tags: [hide-input]\n\nx = 1\n\ny = 2\n```\nmore\n")
    assert cells == [["x = 1", "y = 2"]]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapters_only_load_call_plot_and_glue(path):
    """A chapter's analysis lives in distperf.analysis, tested: no function or class is defined in a chapter,
    and no code cell is longer than 40 lines."""
    cells = code_cells(path.read_text())
    defined = [line for cell in cells for line in cell if re.match(r"\s*(async\s+)?(def|class)\s", line)]
    assert not defined, f"{path.name} defines {defined}"
    assert all(len(cell) <= 40 for cell in cells), f"{path.name}: cells of {[len(c) for c in cells]} lines"


def test_the_median_chapter_code_cell_is_short():
    import statistics

    lengths = [len(cell) for path in CHAPTERS for cell in code_cells(path.read_text())]
    assert lengths and statistics.median(lengths) <= 15


DISPLAY_MATH = re.compile(r"^\$\$(.*?)\$\$[ \t]*(?:\((eq-[\w-]+)\))?[ \t]*$", re.S | re.M)
EQ_REFERENCE = re.compile(r"\{eq\}`([^`]+)`")
FRAMEWORK = ROOT / "chapters" / "analytical_framework.md"


def display_equations(text: str) -> list[tuple[str, str | None]]:
    """Each display equation of a MyST chapter (``$$ ... $$``) with its label, None if it has none."""
    return [(body.strip(), label or None) for body, label in DISPLAY_MATH.findall(text)]


def test_display_equations_are_read_with_their_labels():
    text = "a\n\n$$x = 1$$ (eq-one)\n\nb\n\n$$\ny = 2\n$$\n\ninline $z$ and $$w$$ (eq-two)\n"
    assert display_equations(text) == [("x = 1", "eq-one"), ("y = 2", None)]


def test_every_display_equation_is_numbered_and_every_reference_resolves():
    """The book reads like a paper: each display equation carries a label (so Sphinx numbers it), labels are
    unique, and each {eq} reference names one of them."""
    labels, unlabelled, references = [], [], set()
    for path in CHAPTERS:
        text = path.read_text()
        for body, label in display_equations(text):
            (labels.append(label) if label else unlabelled.append(f"{path.name}: {body[:40]}"))
        references |= set(EQ_REFERENCE.findall(text))
    assert not unlabelled, f"display equations without a label: {unlabelled}"
    assert len(labels) == len(set(labels)), f"labels used twice: {sorted(labels)}"
    assert references <= set(labels), f"references to no equation: {sorted(references - set(labels))}"


def test_the_frameworks_equations_live_in_one_chapter_and_are_cited_from_others():
    """The framework's equations are stated once, in the framework chapter; every other chapter that uses one cites
    it by number, and at least half of them are cited outside the framework chapter."""
    framework = {label for _, label in display_equations(FRAMEWORK.read_text())}
    cited = {ref for path in CHAPTERS if path != FRAMEWORK for ref in EQ_REFERENCE.findall(path.read_text())}
    assert len(framework) >= 8
    assert len(framework & cited) >= len(framework) / 2, f"cited elsewhere: {sorted(framework & cited)}"
    restated = [(path.name, body[:40]) for path in CHAPTERS if path != FRAMEWORK
                for body, _ in display_equations(path.read_text())
                if body in {b for b, _ in display_equations(FRAMEWORK.read_text())}]
    assert not restated, f"framework equations restated instead of cited: {restated}"


def test_a_readers_environment_is_the_pinned_one_without_torch(tmp_path):
    import importlib.util
    import tomllib

    spec = importlib.util.spec_from_file_location("reader_requirements", ROOT / "scripts" / "reader_requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    wanted = module.requirements(ROOT / "pyproject.toml")
    names = {r.split("==")[0] for r in wanted}
    assert all("==" in r for r in wanted)
    assert {"torch", "accelerate"}.isdisjoint(names) and {"jupyter-book", "numpy", "selenium"} <= names
    book = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["book"]
    assert {r for r in book if not r.startswith("accelerate")} <= set(wanted)
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["torch==1", "numpy==2"]\n'
                                             '[project.optional-dependencies]\nbook = ["accelerate==3", "x==4"]\n'
                                             'test = ["pytest==5", "selenium==6"]\n')
    assert module.requirements(tmp_path / "pyproject.toml") == ["numpy==2", "x==4", "selenium==6"]
