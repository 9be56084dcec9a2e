"""The library's structure: arrows point down, one place applies the parallelisms, no private imports.

Layers, top down: ``commands`` (the command line) and ``cli``; ``runner`` (experiments, sweeps) and ``analysis``
(what the chapters compute); ``parallel`` (trainers), ``measure`` and ``emulation``; ``cost`` (pure Python); the
ground floor (``config``, ``presets``, ``hardware``, ``model``, ``tokens``, ``results``, ...).
"""
from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib" / "distperf"
UPPER = {"commands", "cli", "runner", "analysis"}
LOWER = {"cost", "parallel", "measure", "emulation", "config", "presets", "hardware", "model", "tokens", "results",
         "published", "units", "launch", "flags", "train"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(LIB.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """(imported module, names) of every import in the file, relative ones resolved, function bodies included."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            yield target, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _all():
    return [(p, _module(p), list(_imports(p))) for p in sorted(LIB.rglob("*.py"))]


def test_arrows_point_down():
    wrong = [f"{module} imports {target}" for path, module, imports in _all() for target, _ in imports
             if target.startswith("distperf.") and _layer(module) in LOWER and _layer(target) in UPPER]
    assert wrong == []


def test_only_the_command_line_imports_commands():
    wrong = [f"{module} imports {target}" for path, module, imports in _all() for target, _ in imports
             if target.startswith("distperf.commands") and _layer(module) not in ("commands", "cli")]
    assert wrong == []


def test_no_module_imports_another_modules_private_names():
    wrong = [f"{module} imports {name} from {target}" for path, module, imports in _all()
             for target, names in imports if target.startswith("distperf") and target != module
             for name in names if name.startswith("_") and not name.startswith("__")]
    assert wrong == []


def test_the_cost_model_imports_no_torch():
    wrong = [f"{module} imports {target}" for path, module, imports in _all() if _layer(module) == "cost"
             for target, _ in imports if target.split(".")[0] == "torch"]
    assert wrong == []


def test_the_chapters_import_no_torch():
    """What the book's chapters import loads without torch (a reader's build draws everything from tables, the
    cost model and the analysis; importing torch in each chapter's kernel would cost seconds per chapter)."""
    import re
    import subprocess
    import sys

    chapters = LIB.parents[1] / "chapters"
    statement = re.compile(r"^(?:from distperf\S* import .+|import distperf\S*)$", re.M)
    lines = sorted({line for path in chapters.glob("*.md") for line in statement.findall(path.read_text())})
    assert len(lines) > 10
    code = "\n".join([*lines, "import sys", "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=chapters)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_the_parallelisms_are_applied_in_one_place():
    """Tensor parallelism, recomputation, precision and data parallelism are applied to a model part only by
    parallel/parallelize.py; the trainers call it."""
    appliers = ("apply_tensor_parallel(", "set_recompute(", "autocast_dtype =", "apply_data_parallel(")
    places = {(path.name, a) for path in (LIB / "parallel").glob("*.py") for a in appliers if a in path.read_text()
              and not path.read_text().count(f"def {a}")}
    assert places == {("parallelize.py", a) for a in appliers}
    for trainer in ("single.py", "spmd.py", "pipeline.py"):
        assert "parallelize(" in (LIB / "parallel" / trainer).read_text(), trainer
