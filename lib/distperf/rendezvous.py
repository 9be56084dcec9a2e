"""A rendezvous for torchrun on one machine that listens on the loopback interface only.

``torchrun --standalone`` starts its stores (the rendezvous's and the one the ranks bootstrap from) as
``TCPStore`` servers, which bind every interface: an unauthenticated store that any host of the network can
reach, and through which it could feed a run its keys (torch's issue #173909). On one machine nothing needs more
than loopback. This handler is torch's static TCP rendezvous (one node, the agent's store shared with the ranks,
``torch.distributed.elastic.rendezvous.static_tcp_rendezvous``) with the store served from a socket bound to
127.0.0.1 (``TCPStore(master_listen_fd=…)``). torchrun finds it through the entry point ``torchrun.handlers``
(``pyproject.toml``) and :func:`distperf.launch.launcher_commands` asks for it by name, :data:`BACKEND`; the ranks'
own gloo connections stay on loopback through ``GLOO_SOCKET_IFNAME`` (:func:`distperf.launch.rank_environment`).
Runs across hosts (``--network``, or torchrun by hand) are not affected: they need a reachable store.
"""
from __future__ import annotations

import socket

BACKEND = "distperf-loopback"
LOOPBACK = "127.0.0.1"


def listening_socket(port: int = 0) -> socket.socket:
    """A TCP socket bound to :data:`LOOPBACK` (``port`` 0: one the kernel picks), listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.listen(512)
    return sock


def _handler_class():
    from torch.distributed import PrefixStore, TCPStore
    from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    class LoopbackRendezvous(StaticTCPRendezvous):
        """One node; the store on loopback. The ranks join it as clients (the agent's store is shared)."""

        def get_backend(self) -> str:
            return BACKEND

        def next_rendezvous(self) -> RendezvousInfo:
            if not self._store:
                sock = listening_socket(self.master_port)
                self.master_port = sock.getsockname()[1]
                self._store = TCPStore(LOOPBACK, self.master_port, self.world_size, True, self.timeout,
                                       multi_tenant=True, master_listen_fd=sock.detach())
            return RendezvousInfo(PrefixStore(self.run_id, self._store), self.rank, self.world_size,
                                  RendezvousStoreInfo(LOOPBACK, self.master_port))

    return LoopbackRendezvous


def create_handler(params):
    """torchrun's handler for ``--rdzv-backend distperf-loopback`` (one node; ``--rdzv-endpoint HOST:PORT``,
    port 0 or none: any free port; ``--rdzv-conf timeout=SECONDS``, default 900)."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    if params.min_nodes != 1 or params.max_nodes != 1:
        raise ValueError(f"{BACKEND} is for one machine: --nnodes 1, got {params.min_nodes}:{params.max_nodes}")
    _, port = parse_rendezvous_endpoint(params.endpoint or f"{LOOPBACK}:0", default_port=0)
    return _handler_class()(LOOPBACK, port, 0, 1, params.run_id, params.get_as_int("timeout", 900))


def handler():
    """The entry point's object: torchrun calls it and registers what it returns under :data:`BACKEND`."""
    return create_handler
