"""Print the pinned requirements of a reader's build (`make book FROM=reference`), one per argument, for pip.

A reader's build draws the whole book from the archived tables, the cost model and the analysis, none of which
imports torch (tests/test_structure.py checks what the chapters import); it needs the project's dependencies and
the book's, less torch and accelerate (which only the trainers use), plus selenium, which prints the PDF. torch is
most of the full environment's install time. Reads pyproject.toml with the standard library only (Python 3.11+),
so it runs before any environment exists.
"""
import sys
import tomllib
from pathlib import Path

TRAINING_ONLY = {"torch", "accelerate"}
FOR_THE_PDF = {"selenium"}


def requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = project["dependencies"] + extras["book"] + [r for r in extras["test"] if _name(r) in FOR_THE_PDF]
    return [r for r in wanted if _name(r) not in TRAINING_ONLY]


def _name(requirement: str) -> str:
    return requirement.split("==")[0].strip().lower()


if __name__ == "__main__":
    pyproject = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "pyproject.toml"
    print(" ".join(requirements(pyproject)))
