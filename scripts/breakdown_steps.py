"""How noisy is one breakdown step's communication? An experiment on this machine, archived as reference data.

    python scripts/breakdown_steps.py                                   # 8 runs of 2 pipelines
    python scripts/breakdown_steps.py --repeats 2 --out /tmp/steps.csv  # to try it

The exposed communication of a run is read from its breakdown steps (``distperf.measure.steps``: each profiled alone
from a barrier of the ranks, every step's communication and window kept in ``time_breakdown_s.per_step``), and the
goal of the chapter "Where the time goes" judges the median over ten runs of each configuration. This experiment asks
how much of one step's noise is the step's own and how much the run's: the `small` model on two pipeline stages
(micro-batch 2, m = 8, GPipe and 1F1B: the pipelines whose exposed communication the goal judges most often), each
run in fresh processes through ``distperf run`` (no memory or communication step, no prediction), ``--repeats`` runs
of each (default 8). It prints, per schedule and pipeline rank (:func:`distperf.analysis.breakdown_noise.noise`), the
communication share's relative standard deviation from step to step within a run, that of a run's first step from run
to run, and that of the mean over a run's steps from run to run.

Writes ``data/reference/<machine>/breakdown_steps.csv`` (a row per run, with provenance, as ``distperf sweep`` writes
them; an existing table is resumed, ``--force`` measures again) and its entry in that directory's manifest; the
chapter reads it. Exit status 0 on success, 1 when a run failed, 2 on bad input.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from distperf import reference  # noqa: E402

NAME = "breakdown_steps"
EXPERIMENT = reference.two_stage_experiment(NAME, {"schedule": ["gpipe", "1f1b"]}, microbatches=8)


def main(argv: list[str] | None = None) -> int:
    from distperf.analysis import breakdown_noise

    def report(table) -> str:
        return breakdown_noise.noise(breakdown_noise.step_shares(table)).to_string(index=False,
                                                                                  float_format="{:.1%}".format)

    return reference.experiment_main(EXPERIMENT, __doc__.splitlines()[0], argv, 8, report)


if __name__ == "__main__":
    sys.exit(main())
