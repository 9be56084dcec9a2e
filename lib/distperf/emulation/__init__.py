"""An emulated interconnect: the ranks of a run as hosts of a small cluster on shaped links.

On one CPU machine communication is cheap next to compute; shaping the links between ranks restores a
cluster's ratio of FLOP/s to network bandwidth. Each emulated node is a Linux network namespace; the nodes
hang on one bridge (in a namespace of its own), each through a veth pair whose two ends are shaped with
``tc``'s token bucket (``tbf``) at the inter-node rate; the ranks of one node talk over that namespace's
loopback (optionally shaped at an intra-node rate).

- :mod:`.spec`: ``--network nodes=N,ranks_per_node=R,inter=RATE[,intra=RATE]`` → :class:`~.spec.NetworkSpec`;
- :mod:`.like`: ``--network-like PRESET``: the rate that gives this machine a target cluster's FLOP per byte;
- :mod:`.topology`: set-up and teardown with ``ip`` and ``tc``, names and addresses;
- :mod:`.guardian`: the process that tears a run's namespaces down when the run ends, however it ends;
- :mod:`.launch`: one ``torchrun`` per emulated node, inside its namespace;
- :mod:`.options`: the command-line options of ``run``, ``sweep`` and ``calibrate``.

``python -m distperf calibrate --network SPEC`` measures the links (:mod:`distperf.measure.link_bench`) and
writes a profile whose ``inter_*`` are theirs: pass it to ``run --hardware`` for a prediction on the
emulated cluster (``--hardware auto`` predicts with this machine's unshaped loopback).

It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); without it, :class:`~.topology.NotPrivileged`.
"""
