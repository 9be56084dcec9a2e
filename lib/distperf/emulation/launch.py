"""One ``torchrun`` per emulated node, inside that node's namespace.

Node k runs ``ip netns exec <node k> python -m torch.distributed.run --nnodes N --node-rank k
--nproc-per-node R --master-addr <node 0's address> --master-port P`` (torchrun's static rendezvous): its
ranks are k·R … k·R + R − 1, and gloo binds to the node's link (``GLOO_SOCKET_IFNAME``,
:meth:`~distperf.emulation.topology.Topology.env`). With the mesh order pp, dp, tp
(:mod:`distperf.parallel.mesh`) a node therefore holds whole tensor-parallel groups first, then the
replicas of a stage.
"""
from __future__ import annotations

import sys

from .topology import Topology

MASTER_PORT = 29500  # free in every run: node 0's namespace is new


def torchrun_commands(topo: Topology, program: list[str], port: int = MASTER_PORT) -> list[list[str]]:
    """The argv of each node's launcher; ``program`` is what follows torchrun's own options
    (``-m MODULE ARGS…``)."""
    spec = topo.spec
    return [topo.exec_argv(k, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(spec.nodes),
                               "--node-rank", str(k), "--nproc-per-node", str(spec.ranks_per_node),
                               "--master-addr", topo.master_addr, "--master-port", str(port),
                               "--max-restarts", "0", "--monitor-interval", "0.1", *program])
            for k in range(spec.nodes)]
