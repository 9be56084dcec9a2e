"""A pipeline's communication on the wait clock and on the breakdown steps, run by run: an experiment on this
machine, archived as reference data.

    python scripts/pipeline_instruments.py                                   # 6 runs of 4 pipelines
    python scripts/pipeline_instruments.py --repeats 2 --out /tmp/pipe.csv   # to try it

The book reads a pipeline's exposed communication from its breakdown steps (the profiler:
``distperf.measure.breakdown``); every pipeline run over gloo also keeps a wait clock on its timed steps, no profiler
(``distperf.measure.wait_clock``: the seconds its thread spends posting sends and receives and waiting on them, in
all and by call). This experiment puts the two side by side where the model misses most: the `small` model on two
pipeline stages, micro-batch 2, GPipe and 1F1B at m = 4 and 8, each run in fresh processes through ``distperf run``
(no memory or communication step), ``--repeats`` runs of each (default 6). It prints, per schedule, m and rank, the
medians over the runs (``distperf.analysis.pipeline_instruments.compare``) and, priced with this machine's archived
profile where there is one, the model's exposed communication and bubble of the rank that ends the iteration.

Writes ``data/reference/<machine>/pipeline_instruments.csv`` (a row per run, with provenance, as ``distperf sweep``
writes them; an existing table is resumed, ``--force`` measures again) and its entry in that directory's manifest;
the chapter "Where the time goes" reads it. Exit status 0 on success, 1 when a run failed, 2 on bad input.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from distperf import reference  # noqa: E402
from distperf.analysis import pipeline_instruments as pi  # noqa: E402

EXPERIMENT = reference.two_stage_experiment(pi.NAME, {"schedule": ["gpipe", "1f1b"], "microbatches": [4, 8]})


def main(argv: list[str] | None = None) -> int:
    from distperf import results
    from distperf.hardware import load_profile

    def report(table) -> str:
        profile = results.DATA / "reference" / results.machine_slug("cpu") / "hardware.json"
        compared = pi.compare(pi.per_run(table), pi.predictions(table, load_profile(profile) if profile.exists()
                                                                 else None))
        return compared.to_string(index=False, float_format="{:.4f}".format) + "\n" + pi.sentence(compared)

    return reference.experiment_main(EXPERIMENT, __doc__.splitlines()[0], argv, 6, report)


if __name__ == "__main__":
    sys.exit(main())
