"""The memory-anatomy experiment (distperf.runner.anatomy): its points and one measured point."""
from distperf import presets
from distperf.runner import anatomy


def test_each_axis_alone_then_precision_by_recomputation_without_repeats():
    base = dict(model="small", batch=2, seq=64, precision="fp32", recompute="none")
    axes = dict(model=["tiny", "small"], batch=[1, 2], seq=[32, 64], precision=["fp32", "mixed"],
                recompute=["none", "full"])
    points = anatomy.points(base, axes)
    assert points[0] == {**base, "model": "tiny", "seq": presets.model("tiny").seq}  # a model keeps its own seq
    assert base in points and len(points) == len({tuple(sorted(p.items())) for p in points})
    assert {**base, "precision": "mixed", "recompute": "full"} in points  # crossed, though not an axis alone
    assert len(points) == 7  # tiny, the base, batch 1, seq 32, mixed, full, then mixed × full (the rest repeat)
    assert points[-1] == {**base, "precision": "mixed", "recompute": "full"}


def test_a_measured_point_has_every_category_and_the_models_shape():
    point = dict(model="tiny", batch=2, seq=16, precision="fp32", recompute="none")
    row = anatomy.measure_point(point, "cpu", scale="smoke")
    spec = presets.model("tiny")
    assert row["layers"] == spec.layers and row["scale"] == "smoke"
    assert row["parameters"] == 4 * row["parameter_count"] and row["gradients"] == row["parameters"]
    assert row["optimizer_states"] == 2 * row["parameters"] and row["activations"] > 0
    assert row["total"] == sum(row["at_peak"].values())
