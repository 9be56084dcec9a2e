"""What the chapter "How to cite" computes: BibTeX entries for the book and for one of its figures, generated
from the citation metadata in ``CITATION.cff`` (Citation File Format 1.2.0), the commit the book was built from
and the build date.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path


def read_citation(path: Path) -> dict:
    """The citation metadata of a ``CITATION.cff`` file, as a dict."""
    import yaml

    return yaml.safe_load(path.read_text())


def authors(cff: dict) -> str:
    """The authors as BibTeX lists them: each a ``name`` (an entity) or 'family, given', joined by ' and '."""
    return " and ".join(a.get("name") or f"{a['family-names']}, {a['given-names']}" for a in cff["authors"])


def book_key(built: dt.datetime) -> str:
    """The book's BibTeX key: 'distperf' and the year of the build."""
    return f"distperf{built:%Y}"


def book_entry(cff: dict, commit: str, built: dt.datetime) -> str:
    """The book's ``@misc`` entry: title, authors, year and version from ``cff``, the commit and date of the
    build in the note."""
    return f"""@misc{{{book_key(built)},
  title        = {{{{{cff['title']}}}}},
  author       = {{{{{authors(cff)}}}}},
  year         = {{{built:%Y}}},
  version      = {{{cff['version']}}},
  note         = {{Jupyter Book built from commit {commit} on {built:%Y-%m-%d}}},
}}"""


def figure_entry(cff: dict, commit: str, built: dt.datetime, label: str, title: str) -> str:
    """A figure's ``@misc`` entry, keyed '<book key>-<label>': the figure's stable name ``label`` and ``title``,
    its SVG file in the book, the version and commit; its data are named in the figure's caption."""
    key = book_key(built)
    return f"""@misc{{{key}-{label},
  title        = {{{{Figure \\texttt{{{label}}}: {title}}}}},
  author       = {{{{{authors(cff)}}}}},
  year         = {{{built:%Y}}},
  howpublished = {{figures/{label}.svg in the book cited as {key}}},
  note         = {{distperf {cff['version']}, commit {commit}; data: see the figure's caption}},
}}"""


def data_statement(scale: str | None = None) -> str:
    """Which data this build shows: in a reader's build the archive (machine, scale, archived from which commit,
    when, and how many tables), else this machine's fresh measurements, which another build will not reproduce."""
    from .. import results
    from ..reference import read_manifest

    scale = scale or results.book_scale()
    if results.book_from() == "reference":
        directory = results.book_dir(scale)
        m = read_manifest(directory)
        return (f"the reference dataset data/reference/{directory.name}/ ({m['device_name']}, scale {m['scale']}), "
                f"archived {m['archived_at'][:10]} from commit {m['archived_commit']}, {len(m['tables'])} tables, "
                f"each named with its sha256 in MANIFEST.json: stable, citable")
    return (f"this machine's own measurements ({results.machine_slug('cpu')}, scale {scale}, data/fresh/{scale}/, "
            f"commit {results.git_commit()}): a fresh build, which another build will not draw the same")
