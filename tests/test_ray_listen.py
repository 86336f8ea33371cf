"""The local Ray cluster hexsearch starts listens on loopback only: the GCS, the raylet (node manager and
object manager), the agents, every worker's gRPC server, the driver's own, and the data-parallel learners'
rendezvous (the TCPStore rank 0 hosts and gloo's sockets). Token authentication stays on (tests/test_ray_auth.py)."""

from __future__ import annotations

import ipaddress
import os
import time


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped   # "::ffff:127.0.0.1": an IPv6 socket bound to 127.0.0.1
    return addr.is_loopback


def listeners(session_dir: str) -> list[tuple[str, int, int, str]]:
    """(ip, port, pid, command) of every listening TCP socket, and every bound unconnected UDP one, of this
    process, its descendants (GCS, raylet, agents, workers) and any other process of the Ray session."""
    import psutil

    me = psutil.Process()
    procs = {p.pid: p for p in me.children(recursive=True)}
    procs[me.pid] = me
    for p in psutil.process_iter(["pid", "cmdline"]):
        if session_dir in " ".join(p.info["cmdline"] or []):
            procs[p.pid] = p
    found = []
    for c in psutil.net_connections(kind="inet"):
        if c.pid in procs and c.laddr and (c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr)):
            try:   # the executable's name first: a long install path would push it out of a cut cmdline
                proc = procs[c.pid]
                name = f"{proc.name()}: " + " ".join(proc.cmdline())[:80].strip()
            except psutil.Error:
                name = "?"
            found.append((c.laddr.ip, c.laddr.port, c.pid, name))
    return sorted(found)


def test_local_cluster_listens_on_loopback_only():
    import ray

    from trainer.config import TrainConfig
    from trainer.learner_group import LearnerWorker
    from trainer.placement import init_ray

    assert os.environ.get("RAY_AUTH_MODE", "") != "disabled"
    started = not ray.is_initialized()
    init_ray(TrainConfig())
    try:
        @ray.remote(num_cpus=0)
        class Probe:
            def pid(self) -> int:
                return os.getpid()

        probe = Probe.remote()
        ranks = [ray.remote(LearnerWorker).options(num_cpus=0).remote(None, r, 2, 1) for r in range(2)]
        master = ray.get(ranks[0].address.remote(), timeout=60)
        ray.get([a.join_group.remote(master, "gloo") for a in ranks], timeout=60)
        pids = ray.get([probe.pid.remote()] + [a.pid.remote() for a in ranks], timeout=60)
        session_dir = ray._private.worker._global_node.get_session_dir_path()
        # The agents start next to the raylet and may bind a moment after the first actors answer.
        deadline = time.monotonic() + 3
        while True:
            found = listeners(session_dir)
            off = [f"{ip}:{port} pid {pid} {name}" for ip, port, pid, name in found if not _loopback(ip)]
            if off or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert off == [], "listening off loopback:\n" + "\n".join(off)
        owners = {pid for _, _, pid, _ in found}
        assert set(pids) <= owners, (pids, found)   # the scan saw the actors' own servers
        names = [name for *_, name in found]
        assert any(n.startswith("gcs_server") for n in names) and any(n.startswith("raylet") for n in names), names
        assert ray.util.get_node_ip_address() == "127.0.0.1"
    finally:
        if started:
            ray.shutdown()
