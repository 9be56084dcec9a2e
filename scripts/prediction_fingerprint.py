"""Fingerprint of the cost model: predict N seeded random configurations and hash the predictions.

    python scripts/prediction_fingerprint.py [--count 10000] [--out predictions.jsonl]

Every strategy is drawn (data, tensor, sequence and pipeline parallelism with each schedule, ZeRO 0-3,
recomputation, precision, optimizer, explicit partitions, DDP bucket sizes, FLOP-based and profiled compute
times, every hardware preset). The configurations depend only on the seed and on the public configuration
classes, so the same command run against another commit (``PYTHONPATH=OTHER/lib python …``) predicts the
same configurations: equal digests mean bit-for-bit equal predictions (floats are written with ``repr``).
A refactoring that must not change behaviour is checked this way; ``--out`` writes every prediction as JSON
lines, to diff when the digests differ.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random

from distperf.config import Config, ConfigError, Layout, Training, validate
from distperf.cost import predict
from distperf.hardware import PRESETS
from distperf.presets import MODELS

SCHEDULES = ("1f1b", "gpipe", "interleaved", "2bw", "pipedream")


def draw(rng: random.Random) -> tuple[Config, str, float, dict | None]:
    """One random configuration, hardware preset, bucket size and (sometimes) profiled layer times."""
    spec = MODELS[rng.choice(sorted(MODELS))]
    pp = rng.choice((1, 1, 2, 4, 8))
    schedule = rng.choice(SCHEDULES) if pp > 1 else rng.choice(("none", "none", "gpipe", "1f1b"))
    chunks = rng.choice((2, 3)) if schedule == "interleaved" else 1
    tp = rng.choice((1, 1, 2, 4, 8))
    recompute = rng.choice(("none", "selective", "full"))
    partition = ()
    stages = pp * chunks
    if stages > 1 and rng.random() < 0.2 and spec.layers >= stages:
        cuts = sorted(rng.sample(range(1, spec.layers), stages - 1))
        partition = tuple(b - a for a, b in zip((0, *cuts), (*cuts, spec.layers)))
    layout = Layout(dp=rng.choice((1, 2, 4, 8, 64)), tp=tp, pp=pp,
                    sequence_parallel=tp > 1 and rng.random() < 0.5, schedule=schedule, chunks=chunks,
                    micro_batch=rng.choice((1, 2, 4, 8)), microbatches=rng.choice((1, 2, 4, 8, 16, 32)),
                    zero=rng.choice((0, 1, 2, 3)), recompute=recompute, partition=partition)
    training = Training(precision=rng.choice(("fp32", "mixed")), optimizer=rng.choice(("adam", "adam", "sgd")),
                        momentum=rng.random() < 0.8)
    hw = rng.choice(sorted(PRESETS))
    bucket = rng.choice((25 * 2**20, 2**20, 2**16, 100 * 2**20))
    times = None
    if rng.random() < 0.3:
        times = {part: (rng.uniform(1e-4, 1e-1), rng.uniform(1e-4, 2e-1)) for part in ("layer", "embedding", "head")}
    return Config(model=spec, layout=layout, training=training), hw, bucket, times


def configurations(count: int, seed: int = 0):
    rng = random.Random(seed)
    found = 0
    while found < count:
        cfg, hw, bucket, times = draw(rng)
        try:
            validate(cfg)
        except ConfigError:
            continue
        found += 1
        yield cfg, hw, bucket, times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write every configuration and prediction as JSON lines")
    a = p.parse_args(argv)
    digest = hashlib.sha256()
    out = open(a.out, "w") if a.out else None
    strategies: dict[str, int] = {}
    for cfg, hw, bucket, times in configurations(a.count, a.seed):
        result = predict(cfg, PRESETS[hw], bucket_bytes=bucket, layer_times=times)
        line = json.dumps({"config": cfg.to_dict(), "hardware": hw, "bucket_bytes": bucket, "layer_times": times,
                           "prediction": result}, sort_keys=True)
        digest.update(line.encode())
        if out:
            out.write(line + "\n")
        lay = cfg.layout
        key = (f"{'dp ' if lay.dp > 1 else ''}{'tp ' if lay.tp > 1 else ''}{'sp ' if lay.sequence_parallel else ''}"
               f"{'pp/' + lay.schedule if lay.pp > 1 else ''}{' zero' + str(lay.zero) if lay.zero else ''}").strip()
        strategies[key or "single"] = strategies.get(key or "single", 0) + 1
    if out:
        out.close()
    print(f"{a.count} predictions, {len(strategies)} distinct strategies; sha256 {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
