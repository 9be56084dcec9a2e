"""Set up and tear down an emulated cluster with ``ip`` and ``tc`` (iproute2).

For a run with N nodes (:class:`~distperf.emulation.spec.NetworkSpec`) it creates N + 1 network
namespaces, named ``distperf-<pid>-<token>-node<k>`` and ``distperf-<pid>-<token>-switch`` (``pid``: the
process that owns them):

- the **switch** namespace holds a bridge ``br0``; nothing is created in the root namespace (no address,
  no link, no route);
- **node k** holds one end of a veth pair, ``link0``, with address 198.18.0.(k+1)/24 (the benchmarking
  range 198.18.0.0/15, RFC 2544), an on-link route to that /24 and no default route, and its loopback;
  the pair's other end, ``n<k>``, sits in the switch namespace, enslaved to the bridge;
- both ends of every veth pair are shaped on egress with ``tbf`` at the inter-node rate (a node's link is
  full duplex: ``link0`` shapes what the node sends, ``n<k>`` what it receives); with an intra-node rate
  the loopback of every node is shaped too.

Deleting a namespace destroys its interfaces and their qdiscs (and a veth's peer), so teardown is: stop
the processes still inside, delete the namespaces. :func:`emulated` does both on the way out and starts a
:mod:`~distperf.emulation.guardian` that does it when the owner dies without doing it (SIGKILL); set-up
also removes the namespaces of owners that are no longer alive.

Test hook: ``DISTPERF_NETWORK_UNPRIVILEGED=1`` in the environment makes :func:`check_privileges` fail as
it does for a user without root, so that the unprivileged path can be tested as root.
"""
from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from .spec import NetworkSpec, format_rate

IP, TC = "ip", "tc"
PREFIX = "distperf-"
IFNAME = "link0"  # each node's interface (GLOO_SOCKET_IFNAME)
BRIDGE = "br0"
SUBNET = "198.18.0"  # /24 inside 198.18.0.0/15
MTU = 9000  # jumbo frames, as data-centre networks use them
MTU_FRAME = MTU + 14  # bytes on the wire of a full Ethernet frame
UNPRIVILEGED_HOOK = "DISTPERF_NETWORK_UNPRIVILEGED"
_NAME = re.compile(rf"^{PREFIX}(\d+)-([0-9a-f]+)-(switch|node\d+)$")
_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"


class NotPrivileged(RuntimeError):
    """The emulation cannot be set up: network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)."""


class SetupError(RuntimeError):
    """An ``ip`` or ``tc`` command failed for another reason than privileges."""


@dataclass(frozen=True)
class Topology:
    """The names and addresses of one run's emulated cluster."""

    spec: NetworkSpec
    run_id: str  # "<owner pid>-<token>"

    @classmethod
    def new(cls, spec: NetworkSpec) -> "Topology":
        return cls(spec, f"{os.getpid()}-{secrets.token_hex(3)}")

    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.run_id}-switch"

    def node(self, k: int) -> str:
        return f"{PREFIX}{self.run_id}-node{k}"

    @property
    def namespaces(self) -> list[str]:
        """Node namespaces first, then the switch (the order of teardown)."""
        return [self.node(k) for k in range(self.spec.nodes)] + [self.switch]

    @staticmethod
    def address(k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    @property
    def master_addr(self) -> str:
        return self.address(0)

    def exec_argv(self, k: int, argv: list[str]) -> list[str]:
        """``argv`` run inside node k's namespace."""
        return [IP, "netns", "exec", self.node(k), *argv]

    @staticmethod
    def env() -> dict:
        """Environment of a rank: gloo binds to the node's link (peers on the same node are then reached
        over its loopback, those on other nodes over the shaped link)."""
        return {"GLOO_SOCKET_IFNAME": IFNAME, "TP_SOCKET_IFNAME": IFNAME}


def tbf_args(rate_bits: float, packet: int = MTU_FRAME) -> list[str]:
    """``tbf`` parameters for ``rate_bits``: burst = max(min(1 ms at the rate, 32 KiB), 2 packets) — the
    bucket must hold a whole packet, and what it holds passes at the veth's own speed, so it is kept to
    a millisecond's worth and at most 32 KiB (1 MiB then sees the rate within about 3 %, where 1 ms at
    1 Gbit/s, 125 KB, let it through 10 % faster); queue ``limit`` = max(100 ms at the rate, 4 bursts,
    256 KiB), deep enough that TCP is not made to drop and retransmit at low rates."""
    rate_bytes = rate_bits / 8
    burst = int(max(min(rate_bytes * 1e-3, 32 * 1024), 2 * packet))
    limit = int(max(rate_bytes * 0.1, 4 * burst, 256 * 1024))
    return ["rate", format_rate(rate_bits), "burst", str(burst), "limit", str(limit)]


def check_privileges(env: dict | None = None) -> None:
    """Raise NotPrivileged unless this process may create network namespaces (root); ``env``: the
    environment to read the test hook from (default this process's)."""
    if (os.environ if env is None else env).get(UNPRIVILEGED_HOOK):
        raise NotPrivileged(f"the emulated network needs root ({UNPRIVILEGED_HOOK} is set: simulated)")
    if os.geteuid() != 0:
        raise NotPrivileged("the emulated network needs root (ip netns, tc); this process runs as "
                            f"user id {os.geteuid()}")


def _env() -> dict:
    return {**os.environ, "PATH": f"{os.environ.get('PATH', '')}:{_PATH}"}


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """One ``ip``/``tc`` command; a failure raises NotPrivileged (EPERM) or SetupError naming it."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, env=_env())
    except FileNotFoundError:
        raise SetupError(f"{argv[0]} (iproute2) is not installed") from None
    if check and proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        message = message[-1] if message else f"exit status {proc.returncode}"
        if re.search(r"Operation not permitted|Permission denied", message):
            raise NotPrivileged(f"the emulated network needs root: `{' '.join(argv)}`: {message}")
        raise SetupError(f"`{' '.join(argv)}` failed: {message}")
    return proc


def create(topo: Topology) -> None:
    """Create the namespaces, the bridge, the veth pairs, addresses and qdiscs of ``topo``."""
    spec, sw = topo.spec, topo.switch
    _ip(IP, "netns", "add", sw)
    _ip(IP, "-n", sw, "link", "add", BRIDGE, "type", "bridge")
    _ip(IP, "-n", sw, "link", "set", BRIDGE, "up")
    for k in range(spec.nodes):
        ns, peer = topo.node(k), f"n{k}"
        _ip(IP, "netns", "add", ns)
        _ip(IP, "-n", ns, "link", "add", IFNAME, "mtu", str(MTU), "type", "veth", "peer", "name", peer,
            "mtu", str(MTU), "netns", sw)
        _ip(IP, "-n", sw, "link", "set", peer, "master", BRIDGE)
        _ip(IP, "-n", sw, "link", "set", peer, "up")
        _ip(IP, "-n", ns, "addr", "add", f"{topo.address(k)}/24", "dev", IFNAME)
        _ip(IP, "-n", ns, "link", "set", IFNAME, "up")
        _ip(IP, "-n", ns, "link", "set", "lo", "up")
        _ip(TC, "-n", ns, "qdisc", "add", "dev", IFNAME, "root", "tbf", *tbf_args(spec.inter))
        _ip(TC, "-n", sw, "qdisc", "add", "dev", peer, "root", "tbf", *tbf_args(spec.inter))
        if spec.intra:
            _ip(TC, "-n", ns, "qdisc", "add", "dev", "lo", "root", "tbf", *tbf_args(spec.intra, 65536 + 14))


def namespaces() -> list[str]:
    """Every network namespace with a name (``ip netns list``)."""
    proc = _ip(IP, "netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale(names: list[str] | None = None) -> list[str]:
    """Namespaces of ours whose owner process is no longer alive."""
    found = []
    for name in namespaces() if names is None else names:
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1))):
            found.append(name)
    return found


def teardown(names: list[str]) -> None:
    """Kill the processes inside each namespace and delete it; names that do not exist are skipped.
    Never raises: it runs on every way out."""
    existing = set(namespaces())
    for name in names:
        if name not in existing:
            continue
        for _ in range(3):
            pids = [int(p) for p in _ip(IP, "netns", "pids", name, check=False).stdout.split() if p.isdigit()]
            pids = [p for p in pids if p != os.getpid()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)
        _ip(IP, "netns", "del", name, check=False)


def start_guardian(names: list[str]) -> subprocess.Popen:
    """Start the guardian of ``names``: it deletes them when the pipe it reads closes (this process
    ended, however). It runs in a session of its own and without the launch tags, so that stopping
    this run's processes does not stop it before its work."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_TAG")}
    return subprocess.Popen([sys.executable, "-m", "distperf.emulation.guardian", *names], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)


@contextmanager
def emulated(spec: NetworkSpec):
    """Set up the emulated cluster of ``spec``; yield its :class:`Topology`; tear it down on the way out,
    also after an exception or a signal (the guardian covers SIGKILL). Raises NotPrivileged without root
    and SetupError when an ``ip``/``tc`` command fails; nothing is left behind in either case."""
    check_privileges()
    teardown(stale())
    topo = Topology.new(spec)
    guardian = start_guardian(topo.namespaces)
    try:
        create(topo)
        yield topo
    finally:
        teardown(topo.namespaces)
        guardian.stdin.close()
        try:
            guardian.wait(timeout=10)
        except subprocess.TimeoutExpired:
            guardian.kill()
            guardian.wait()
