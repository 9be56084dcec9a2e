"""What the book's chapters compute from the result tables: the chapters only load, call, plot and glue.

Pure pandas and numpy over the tables in ``data/`` (and the cost model); each module is tested on small
synthetic tables (``tests/test_analysis_*.py``), every verdict and interpretive sentence on both sides of its rule.

Shared by several chapters:

- :mod:`.rows`: reading sweep tables — the rows that ran, JSON kept in CSV cells, the configuration a row
  trained and its global batch, the memory it measured, the predictions beside it;
- :mod:`.measured_vs_predicted`: measured against predicted memory by category and iteration time, the
  signed-error tables and ranges the prose quotes;
- :mod:`.repeats`: the run-to-run spread of a configuration's repeats — the median over repeats and a 95 %
  confidence interval of its iteration time, beside the spread of the steps inside a run.

One module per chapter for what only that chapter computes (its tables, figures' data, crossovers, verdict):
:mod:`.analytical_framework`, :mod:`.layer_timing`, :mod:`.calibration`, :mod:`.memory_anatomy`, :mod:`.dp_zero`,
:mod:`.tensor_parallel`, :mod:`.pipeline_schedules`, :mod:`.partitioning`, :mod:`.pp_vs_dp`, :mod:`.twobw`,
:mod:`.planner`, :mod:`.network`, :mod:`.papers_scale`, :mod:`.how_to_cite`.
"""
