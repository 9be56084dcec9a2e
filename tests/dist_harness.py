"""Run a function on N real gloo ranks (forked processes) with a timeout; used by the parallel tests.

Forking (not spawning) keeps each test at a fraction of a second of start-up: the children inherit
the imported torch. Each child joins a gloo process group through the same environment variables
torchrun sets, runs the function and sends back its result (tensors as numpy arrays). A child that
fails, or a run that outlives ``timeout``, fails the test, and every child is killed.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback

import numpy as np


def reserved_port() -> socket.socket:
    """A socket bound to a free loopback port and kept open, not listening: while it is held the kernel gives the
    port to no other socket (a port found free and released could be taken, by another test's gloo or a notebook's
    kernel, before rank 0's store binds it), and rank 0's TCPStore still binds it (SO_REUSEADDR on both sockets:
    libuv sets it on the store's)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def _plain(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    return obj


def _child(fn, rank, world_size, port, results, args, env):
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **env})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        results.put((rank, "ok", _plain(fn(*args))))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn, world_size: int, *args, timeout: float = 60.0, env: dict | None = None) -> list:
    """Results of ``fn(*args)`` on ranks 0…world_size-1, in rank order. ``timeout`` is for a machine that runs one
    test at a time; under pytest-xdist (make test) each worker shares the cores with the others, and it is stretched
    by their number."""
    timeout *= max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    held = reserved_port()
    port = held.getsockname()[1]
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, port, results, args, env or {}), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    out, deadline = {}, time.monotonic() + timeout
    try:
        while len(out) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{world_size - len(out)} rank(s) did not finish within {timeout} s")
            try:
                rank, status, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"rank {procs.index(dead[0])} exited with {dead[0].exitcode}")
                continue
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5 if len(out) == world_size else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
        held.close()
    return [out[r] for r in range(world_size)]


def relative_error(a, b) -> float:
    """‖a − b‖ / ‖b‖ (norm-wise relative error; 0 if both are 0)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / nb) if nb else float(np.linalg.norm(a))


# ---------------------------------------------------------------- equality with the single-device reference
# One seed, one global batch, fp32, no dropout, 3 steps. SGD with momentum and a large step, so that
# every parameter moves by 10–100 % of its size and an error in any gradient shows in the parameters.
# (Adam is not used for the parameter check: the key bias has an exactly zero gradient — softmax
# ignores a shift shared by all keys — so Adam's g/(|g| + eps) turns rounding noise of 1e-10 into
# updates of order 1e-2·lr that differ between any two summation orders; losses agree all the same.)
GLOBAL_BATCH = 4
TOLERANCE = 1e-5


def tiny_spec(**overrides):
    from dataclasses import replace

    from distperf import presets

    return replace(presets.model("tiny"), layers=4, **overrides)


def run_options(**overrides):
    from distperf.config import RunOptions

    return RunOptions(**{"steps": 3, "seed": 1, "lr": 0.2, "device": "cpu", "warmup": 0, **overrides})


def train_job(cfg, opts):
    from distperf.parallel.loop import run_training

    result = run_training(cfg, opts, parameters=True)
    return {"losses": result["losses"], "parameters": result["parameters"]}


def _reference_job(cfg, opts):
    from distperf.model import build_model

    initial = {n: p.detach().clone() for n, p in build_model(cfg.model, opts.seed).named_parameters()}
    return {**train_job(cfg, opts), "initial": initial}


_REFERENCES: dict = {}


def reference(spec, training, opts):
    """Single-device run on the whole global batch at once (computed in a forked child, cached)."""
    from distperf.config import Config, Layout, validate

    key = (spec, training, opts)
    if key not in _REFERENCES:
        cfg = validate(Config(model=spec, layout=Layout(micro_batch=GLOBAL_BATCH, microbatches=1), training=training))
        _REFERENCES[key] = spawn(_reference_job, 1, cfg, opts)[0]
    return _REFERENCES[key]


def check_against_reference(layout, spec=None, optimizer="sgd", opts=None, parameters=True, ref=None):
    """Train ``layout`` on its real gloo ranks; assert its losses (and parameters) equal the reference's
    within TOLERANCE (relative, norm-wise per tensor) on every rank. Returns the ranks' results."""
    from distperf.config import Config, Training, validate

    spec = spec or tiny_spec()
    opts = opts or run_options()
    training = Training(optimizer=optimizer)
    cfg = validate(Config(model=spec, layout=layout, training=training))
    assert cfg.layout.global_batch == GLOBAL_BATCH
    ref = ref or reference(spec, training, opts)
    results = spawn(train_job, cfg.layout.world_size, cfg, opts, timeout=90)
    moved = relative_error(np.concatenate([v.ravel() for v in ref["parameters"].values()]),
                           np.concatenate([v.ravel() for v in ref["initial"].values()]))
    assert moved > 100 * TOLERANCE, "the reference must move for the comparison to mean anything"
    held = set()
    for rank, result in enumerate(results):
        assert len(result["losses"]) == len(ref["losses"])
        for step, (loss, expected) in enumerate(zip(result["losses"], ref["losses"])):
            assert relative_error(loss, expected) <= TOLERANCE, (rank, step, loss, expected)
        if not parameters:
            continue
        for name, value in result["parameters"].items():
            expected = ref["parameters"]["tok.weight" if name == "head.weight" and spec.tied else name]
            err = relative_error(value, expected)
            assert err <= TOLERANCE, f"rank {rank}: {name} differs from the reference by {err:.2e}"
            held.add(name)
    if parameters:
        assert set(ref["parameters"]) <= held, f"parameters held by no rank: {set(ref['parameters']) - held}"
    return results
