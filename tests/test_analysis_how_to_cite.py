"""The BibTeX entries of the chapter "How to cite" (distperf.analysis.how_to_cite), from a small CITATION.cff
written in the test."""
from __future__ import annotations

import datetime as dt

from distperf.analysis import how_to_cite as cite

BUILT = dt.datetime(2031, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
CFF = {"title": "A book", "version": "1.2.3",
       "authors": [{"name": "The authors"}, {"family-names": "Doe", "given-names": "Jane"}]}


def test_read_citation_reads_the_yaml(tmp_path):
    path = tmp_path / "CITATION.cff"
    path.write_text('cff-version: 1.2.0\ntitle: "A book"\nversion: 1.2.3\nauthors:\n  - name: "The authors"\n')
    assert cite.read_citation(path) == {"cff-version": "1.2.0", "title": "A book", "version": "1.2.3",
                                        "authors": [{"name": "The authors"}]}


def test_authors_are_entities_or_family_given_joined_by_and():
    assert cite.authors(CFF) == "The authors and Doe, Jane"
    assert cite.authors({"authors": [{"family-names": "Roe", "given-names": "Rick"}]}) == "Roe, Rick"


def test_book_key_is_the_year_of_the_build():
    assert cite.book_key(BUILT) == "distperf2031"


def test_book_entry():
    assert cite.book_entry(CFF, "abc123", BUILT) == """@misc{distperf2031,
  title        = {{A book}},
  author       = {{The authors and Doe, Jane}},
  year         = {2031},
  version      = {1.2.3},
  note         = {Jupyter Book built from commit abc123 on 2031-02-03},
}"""


def test_figure_entry_is_keyed_by_the_books_key_and_the_label():
    assert cite.figure_entry(CFF, "abc123", BUILT, "fig-x", "A title") == r"""@misc{distperf2031-fig-x,
  title        = {{Figure \texttt{fig-x}: A title}},
  author       = {{The authors and Doe, Jane}},
  year         = {2031},
  howpublished = {figures/fig-x.svg in the book cited as distperf2031},
  note         = {distperf 1.2.3, commit abc123; data: see the figure's caption},
}"""


def test_the_data_statement_names_the_archive_or_says_the_build_is_fresh(tmp_path, monkeypatch):
    import pandas as pd

    from distperf import reference, results
    from distperf.analysis.how_to_cite import data_statement

    monkeypatch.setattr(results, "DATA", tmp_path)
    monkeypatch.delenv("DISTPERF_FROM", raising=False)
    assert data_statement("cpu").startswith("this machine's own measurements") and "will not" in data_statement("cpu")
    results.write_csv_atomic(pd.DataFrame({"a": [1]}), tmp_path / "fresh" / "cpu" / "t.csv")
    reference.archive(tmp_path / "fresh" / "cpu", tmp_path / "reference" / "cpu-2c", "cpu")
    monkeypatch.setenv("DISTPERF_FROM", "reference")
    text = data_statement("cpu")
    assert text.startswith("the reference dataset data/reference/cpu-2c/") and "1 tables" in text
    assert "stable, citable" in text
