"""Communication accounting (distperf.measure.comm) on real gloo process groups."""
from __future__ import annotations

from dist_harness import spawn


def _ddp_step_comm():
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from distperf import presets
    from distperf.measure.comm import CommTracker
    from distperf.model import build_model, lm_loss

    dist.init_process_group("gloo")
    spec = presets.model("tiny")
    model = build_model(spec)
    psi = sum(p.numel() for p in model.parameters())
    ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=0.05)
    optimizer = torch.optim.Adam(ddp.parameters())

    def step():
        x = torch.randint(0, spec.vocab, (2, spec.seq))
        lm_loss(ddp(x), x).backward()
        optimizer.step()
        optimizer.zero_grad()

    step(), step()  # the second step rebuilds DDP's buckets (a broadcast of their order): not a steady step
    with CommTracker({"data_parallel": dist.group.WORLD}) as tracker:
        step()
        step()
    return psi, tracker.summary(steps=2)


def test_ddp_all_reduce_bytes_per_step_equal_the_gradient_bytes():
    for psi, s in spawn(_ddp_step_comm, 2, timeout=60):
        assert s["bytes"] == {"data_parallel": 4 * psi, "tensor_parallel": 0, "pipeline_parallel": 0}
        assert set(s["by_collective"]) == {"data_parallel"}
        assert s["by_collective"]["data_parallel"]["all-reduce"]["bytes"] == 4 * psi
        assert s["sent_bytes"]["data_parallel"] == 2 * (2 - 1) / 2 * 4 * psi  # ring all-reduce, 2 ranks
        assert s["unmatched_events"] == 0
        assert s["time_s"]["data_parallel"] > 0  # every bucket's all-reduce was matched to its gloo event
        assert 0 <= s["exposed_s"]["total"] <= s["window_s"]


def _kinds_comm():
    import time

    import torch
    import torch.distributed as dist

    from distperf.measure.comm import CommTracker

    dist.init_process_group("gloo")
    tp, pp = dist.new_group([0, 1]), dist.new_group([0, 1])
    with CommTracker({"data_parallel": dist.group.WORLD, "tensor_parallel": tp, "pipeline_parallel": pp}) as t:
        dist.all_reduce(torch.ones(1000))  # 4000 bytes
        dist.all_gather_into_tensor(torch.empty(20, dtype=torch.float64), torch.ones(10, dtype=torch.float64),
                                    group=tp)  # the gathered buffer: 160 bytes
        dist.reduce_scatter_tensor(torch.empty(5), torch.ones(10), group=tp)  # the input buffer: 40 bytes
        dist.barrier()
        if dist.get_rank() == 0:
            dist.recv(torch.empty(77), 1, group=pp)  # waits for rank 1, which sleeps first
        else:
            time.sleep(0.2)
            dist.send(torch.ones(77), 0, group=pp)
    return dist.get_rank(), t.summary()


def test_bytes_by_kind_and_collective_and_a_waiting_receiver():
    for rank, s in spawn(_kinds_comm, 2, timeout=60):
        assert s["bytes"] == {"data_parallel": 4000, "tensor_parallel": 200, "pipeline_parallel": 308}
        assert s["by_collective"]["tensor_parallel"] == {
            "all-gather": {"calls": 1, "bytes": 160, "time_s": s["by_collective"]["tensor_parallel"]["all-gather"]["time_s"]},
            "reduce-scatter": {"calls": 1, "bytes": 40, "time_s": s["by_collective"]["tensor_parallel"]["reduce-scatter"]["time_s"]}}
        assert set(s["by_collective"]["pipeline_parallel"]) == {"recv" if rank == 0 else "send"}
        assert s["sent_bytes"]["pipeline_parallel"] == (0 if rank == 0 else 308)
        assert s["unmatched_events"] == 0
        if rank == 0:  # blocked in recv until rank 1 wakes up and sends
            assert s["exposed_s"]["pipeline_parallel"] > 0


def _tensor_parallel_comm():
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from distperf.measure.comm import CommTracker

    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    n, d = 4, 16
    mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))
    parallelize_module(mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(n, d, requires_grad=True)
    mlp(x).sum().backward()
    with CommTracker(mesh) as tracker:
        mlp(x).sum().backward()
    return n, d, tracker.summary()


def test_tensor_parallel_mlp_all_reduces_its_activation_twice():
    """Megatron's MLP: one all-reduce of the (n, d) output in forward, one of the input's gradient in backward."""
    for n, d, s in spawn(_tensor_parallel_comm, 2, timeout=60):
        assert s["bytes"]["tensor_parallel"] == 2 * n * d * 4
        assert s["by_collective"]["tensor_parallel"]["all-reduce"]["calls"] == 2
        assert s["bytes"]["data_parallel"] == 0 and s["unmatched_events"] == 0


def _written() -> int:
    """Bytes this process has handed to write/send system calls, sockets included (``wchar`` of /proc/self/io)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


def _wire_job():
    import torch
    import torch.distributed as dist

    from distperf.measure.comm import CommTracker

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(1))  # gloo's first collectives set up their pairs: not a steady call
    calls = {  # elements chosen so that gloo's segments do not divide evenly
        "all-reduce": lambda: dist.all_reduce(torch.ones(49380)),
        "reduce-scatter": lambda: dist.reduce_scatter_tensor(torch.empty(12345), torch.ones(12345 * n)),  # n = 4
        "all-gather": lambda: dist.all_gather_into_tensor(torch.empty(777 * n), torch.ones(777)),
        "broadcast": lambda: dist.broadcast(torch.ones(5000), src=1),
    }
    out = {}
    for name, call in calls.items():
        call()  # once untracked: a first call of each kind may talk to the store
        dist.barrier()
        with CommTracker({"data_parallel": dist.group.WORLD}) as tracker:
            before = _written()
            call()
            written = _written() - before
        dist.barrier()
        summary = tracker.summary()
        out[name] = (summary["wire_bytes"]["data_parallel"], summary["sent_bytes"]["data_parallel"], written)
    return rank, out


def test_wire_bytes_are_what_gloo_writes_to_its_sockets():
    """On 4 ranks the tracker's wire bytes (gloo's algorithms, distperf.cost.collectives.gloo_sent_bytes) are the
    bytes each process writes, but for gloo's headers (96 bytes a sent message, 48 a receive notification; at
    most 32 messages a call here); a reduce-scatter writes what an all-reduce does, twice the ring's volume;
    the root of a binomial broadcast sends ⌈log₂ 4⌉ = 2 copies, its first child one, the leaves none."""
    results = dict(spawn(_wire_job, 4, timeout=90))
    for rank, calls in results.items():
        for name, (wire, algorithmic, written) in calls.items():
            assert 0 <= written - wire <= 32 * 144, (rank, name, wire, written)
        # the reduce-scatter's input is the all-reduce's size: gloo sends the same, twice the ring reduce-scatter
        assert calls["reduce-scatter"][0] == calls["all-reduce"][0] and calls["reduce-scatter"][1] == 3 * 12345 * 4
        assert calls["all-gather"][0] == calls["all-gather"][1] == 3 * 777 * 4
    assert [results[r]["broadcast"][0] for r in range(4)] == [0, 2 * 20000, 20000, 0]
    assert [results[r]["broadcast"][1] for r in range(4)] == [0, 20000, 0, 0]  # algorithmic: the root's M
    all_reduce = [results[r]["all-reduce"][0] for r in range(4)]
    assert all_reduce == [296288, 296272, 296272, 296288] and sum(all_reduce) / 4 == 2 * 3 / 4 * 49380 * 4


def _late_start_comm():
    import time

    import torch
    import torch.distributed as dist

    from distperf.measure.comm import CommTracker

    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))  # gloo's first collective sets up its pairs
    if dist.get_rank() == 1:
        time.sleep(3.0)  # rank 1 enters the tracker seconds after rank 0
    with CommTracker({"data_parallel": dist.group.WORLD}) as tracker:
        dist.all_reduce(torch.ones(1000))
    return dist.get_rank(), tracker.summary()


def test_a_rank_that_starts_late_is_not_its_neighbours_waiting():
    """The tracked window starts when every rank has entered the tracker: rank 0, which entered seconds before rank
    1, does not count them as exposed communication (one all-reduce of 4000 bytes is all it waits for)."""
    for rank, s in spawn(_late_start_comm, 2, timeout=60):
        assert s["calls"]["data_parallel"] == 1 and s["unmatched_events"] == 0, (rank, s)
        assert s["exposed_s"]["total"] < 1.0 and s["window_s"] < 1.0, (rank, s)  # not the 3 s rank 1 slept
