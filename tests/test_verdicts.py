"""Every verdict rule of the book (distperf.analysis.verdicts) on synthetic statistics on both sides of each
threshold: the verdict and every sentence built from the rule must change with the data, and every chapter with a
verdict must take it from its rule."""
import math
import re
from pathlib import Path

import pytest

from distperf.analysis import verdicts
from distperf.analysis.verdicts import RULES

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"


def side(criterion, good: bool, margin: float = 0.01) -> float:
    """A value just inside (``good``) or just outside the criterion's threshold."""
    step = margin * max(abs(criterion.threshold), 1.0)
    inside = criterion.op == "<="
    return criterion.threshold + (-step if inside == good else step)


def stats(rule, good) -> dict:
    """Statistics on the good or bad side of every criterion (``good`` a bool, or a set of keys that are good)."""
    return {c.key: side(c, good if isinstance(good, bool) else c.key in good) for c in rule.criteria}


@pytest.mark.parametrize("name", sorted(RULES))
def test_the_verdict_and_its_sentences_flip_with_the_data(name):
    rule = RULES[name]
    good, bad = stats(rule, True), stats(rule, False)
    assert rule.verdict(good) == "reproduced" and rule.verdict(bad) == "not reproduced"
    assert rule.explanation(good) != rule.explanation(bad)
    assert rule.robustness(good) != rule.robustness(bad)
    assert list(rule.sensitivity(good).met) == ["yes"] * len(rule.criteria)
    assert list(rule.sensitivity(bad).met) == ["no"] * len(rule.criteria)
    for c in rule.criteria:  # each criterion alone flips its own sentence, and the verdict with it
        one = {**good, c.key: side(c, False)}
        assert c.sentence(one[c.key]) != c.sentence(good[c.key])
        assert rule.verdict(one) == ("depends" if len(rule.criteria) > 1 else "not reproduced")
        assert c.holds in c.sentence(good[c.key]) and c.fails in c.sentence(one[c.key])


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_threshold_counts_as_met_and_missing_statistics_as_not_measured(name):
    rule = RULES[name]
    exact = {c.key: c.threshold for c in rule.criteria}
    assert rule.verdict(exact) == "reproduced"
    assert rule.verdict({}) == "not measured"
    assert rule.verdict({c.key: math.nan for c in rule.criteria}) == "not measured"
    first = rule.criteria[0]
    assert rule.verdict({first.key: first.threshold}) == "reproduced"  # the others left out, not failed


@pytest.mark.parametrize("name", sorted(RULES))
def test_the_statement_declares_every_threshold_and_the_alternatives_bracket_it(name):
    rule = RULES[name]
    text = rule.statement()
    for c in rule.criteria:
        assert c.statistic in text and c.rule() in text and c.why in text
        assert c.alternatives and min(c.alternatives) <= c.threshold <= max(c.alternatives)


def test_robustness_names_the_thresholds_that_change_the_verdict():
    rule = RULES["partitioning"]
    assert rule.robustness({"rise": 0.5}) == 'the verdict stays "reproduced" for every threshold tried'
    text = rule.robustness({"rise": 0.03})
    assert text.startswith('the verdict is "reproduced" at the declared thresholds, but ')
    assert '≥ 5.0% gives "not reproduced"' in text and '≥ 10.0% gives "not reproduced"' in text


def test_a_value_that_misses_never_prints_as_its_threshold():
    at_most = verdicts.Criterion("x", "x", "<=", 0.25, ".0%", "why", "holds", "fails")
    assert at_most.show(0.2512) == "25.1%" and not at_most.met(0.2512)
    assert at_most.show(0.2500) == "25%" and at_most.show(0.2449) == "24%" and at_most.show(0.31) == "31%"
    assert at_most.show(0.25 + 1e-12) == "25.000000%"  # six more digits at most
    at_least = verdicts.Criterion("y", "y", ">=", 1.0, ".2f", "why", "holds", "fails")
    assert at_least.show(0.999) == "0.999" and at_least.show(1.001) == "1.001" and at_least.show(0.98) == "0.98"
    assert "(rule: ≤ 25%, not met)" in at_most.sentence(0.2512) and "is 25.1%" in at_most.sentence(0.2512)


def test_helpers():
    assert verdicts.threshold("time_breakdown", "profiled_median") == 0.05
    assert verdicts.share(1, 4) == 0.25 and math.isnan(verdicts.share(0, 0))


def test_every_chapter_with_a_verdict_takes_it_from_its_rule():
    for path in sorted(CHAPTERS.glob("*.md")):
        text = path.read_text()
        if "{glue:text}`verdict`" not in text:
            continue
        name = path.stem
        assert name in RULES, f"{path.name} shows a verdict but has no rule"
        assert f'book.glue_verdict("{name}"' in text, path.name
        assert not re.search(r'glue\("verdict"', text), f"{path.name} glues a verdict of its own"
        assert "How the verdict is reached" in text and "{glue:text}`rule`" in text, path.name
        assert text.index("{glue:text}`rule`") < text.index("{glue:text}`verdict`"), path.name
        assert f"tbl-{name.replace('_', '-')}-rule" in text, path.name
        assert not re.search(r"\*\*Verdict: (reproduced|depends|not reproduced)", text), path.name
    intro = (CHAPTERS / "intro.md").read_text()
    for name in RULES:
        assert f"{name}.md::verdict:s" in intro, name
