"""Where a pipeline's step goes beyond the cost model's formula, action by action: an experiment on this machine,
archived as reference data.

    python scripts/pipeline_timeline.py                                   # 6 runs of 4 pipelines
    python scripts/pipeline_timeline.py --repeats 2 --out /tmp/tl.csv     # to try it

Each run (the `small` model on two pipeline stages, micro-batch 2, GPipe and 1F1B at m = 4 and 8, in fresh processes
through ``distperf run``, no memory or communication step) writes its first breakdown step's timeline
(``--trace``: ``distperf.measure.timeline``) and keeps it in numbers (``distperf.measure.pipeline_replay``): the
pipeline's span, its replay without stalls, the same at the ranks' median action times, and the cost model's closed
form over those medians. It prints, per schedule and m, the medians over the runs and a sentence; the last run's trace
is left beside the table as ``pipeline_timeline.trace.json`` (open it in Perfetto; the chapter draws it).

Writes ``data/reference/<machine>/pipeline_timeline.csv`` (a row per run, with provenance, as ``distperf sweep``
writes them; an existing table is resumed, ``--force`` measures again) and its entry in that directory's manifest;
the chapter "Where the time goes" reads it. Exit status 0 on success, 1 when a run failed, 2 on bad input.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from distperf import reference  # noqa: E402
from distperf.analysis import pipeline_timeline as pt  # noqa: E402

EXPERIMENT = reference.two_stage_experiment(pt.NAME, {"schedule": ["gpipe", "1f1b"], "microbatches": [4, 8]})


def main(argv: list[str] | None = None) -> int:
    import argparse

    from distperf import results

    found = argparse.ArgumentParser(add_help=False)  # only --out, to put the trace beside the table
    found.add_argument("--out", type=Path)
    out = found.parse_known_args(argv)[0].out
    directory = out.parent if out else results.DATA / "reference" / results.machine_slug("cpu")
    experiment = {**EXPERIMENT, "base": {**EXPERIMENT["base"], "trace": str(directory.resolve() / pt.TRACE)}}

    def report(table) -> str:
        compared = pt.compare(pt.runs(table))
        return compared.to_string(index=False, float_format="{:.2f}".format) + "\n" + pt.sentence(compared)

    return reference.experiment_main(experiment, __doc__.splitlines()[0], argv, 6, report)


if __name__ == "__main__":
    sys.exit(main())
