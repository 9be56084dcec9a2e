"""What the book's chapters compute from the result tables: the chapters only load, call, plot and glue.

Pure pandas and numpy over the tables in ``data/`` (and the cost model); each module is tested on small
synthetic tables (``tests/test_analysis_*.py``).

- :mod:`.rows`: reading sweep tables — the rows that ran, JSON kept in CSV cells, the configuration a row
  trained, the memory it measured, the predictions beside it;

and one module per chapter for what only that chapter computes (its tables, crossovers and verdict).
"""
