"""Phase 2: put the MILP's counts on concrete nodes, keeping fast links inside groups.

The cluster is a graph: one vertex per node (weight = its devices), edges weighted by the per-device
bandwidth between two nodes (the NIC inside a rack, `inter_rack_gbps` across racks). Then:

1. the trainer's n devices of type g: a METIS bisection (pymetis) of the type-g node graph with target
   weights (n / N_g, 1 - n / N_g) minimises the bandwidth cut between the trainer's nodes and the rest,
   so the trainer's data-parallel traffic stays inside a rack when it can; the part closer to n devices
   is the trainer's, topped up or trimmed node by node along the best-connected order;
2. tensor-parallel groups never span nodes: each engine replica's t devices are taken from one node,
   first the trainer's leftover devices, then nodes by bandwidth to the trainer (the weight-sync cut);
3. the weight sync broadcasts from the trainer: B_sync = min over engine nodes of the best link from a
   trainer node to it (the device's own node: `intra_node_gbps`). Phase 1 assumed the worst link for the
   sync and the NIC between the trainer's nodes; the planner re-solves with the links the placement has
   (B_sync, and the narrowest link between trainer nodes) until they agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from trainer.planner.milp import Problem, Solution
from trainer.planner.specs import Cluster, GpuType


@dataclass
class NodeAssignment:
    name: str
    """Node name `<pool>-<i>`."""
    gpu: str
    """GPU type."""
    gpus: int
    """Devices on the node."""
    rack: str
    """Rack (switch domain)."""
    learners: int = 0
    """Trainer devices (one learner process each)."""
    engines: list[int] = field(default_factory=list)
    """Tensor-parallel degree of each engine replica on the node."""

    @property
    def free(self) -> int:
        return self.gpus - self.learners - sum(self.engines)


def node_graph(cluster: Cluster) -> nx.Graph:
    """Vertices: nodes (attributes gpu, gpus, rack, nic); edges: per-device bandwidth in GB/s."""
    g = nx.Graph()
    for pool in cluster.pools:
        for i in range(pool.nodes):
            g.add_node(f"{pool.name}-{i}", gpu=pool.gpu, gpus=pool.gpus_per_node, rack=pool.rack or pool.name,
                       nic=pool.nic_gbps)
    names = list(g.nodes)
    for a_i, a in enumerate(names):
        for b in names[a_i + 1:]:
            na, nb = g.nodes[a], g.nodes[b]
            bw = min(na["nic"], nb["nic"])
            g.add_edge(a, b, bw=bw if na["rack"] == nb["rack"] else min(bw, cluster.inter_rack_gbps))
    return g


def _bisect(g: nx.Graph, nodes: list[str], want: int) -> list[str]:
    """Nodes (of one type) holding about `want` devices, cut from the rest along the weakest links (METIS)."""
    total = sum(g.nodes[n]["gpus"] for n in nodes)
    if want >= total:
        return list(nodes)
    if len(nodes) <= 2 or want <= g.nodes[nodes[0]]["gpus"]:
        return [nodes[0]]
    import pymetis

    index = {n: i for i, n in enumerate(nodes)}
    adjacency = [[index[m] for m in g.neighbors(n) if m in index] for n in nodes]
    eweights = [max(1, int(g.edges[n, m]["bw"])) for n in nodes for m in g.neighbors(n) if m in index]
    xadj, adjncy = [0], []
    for row in adjacency:
        adjncy.extend(row)
        xadj.append(len(adjncy))
    frac = min(max(want / total, 0.01), 0.99)
    _, parts = pymetis.part_graph(2, xadj=xadj, adjncy=adjncy, vweights=[g.nodes[n]["gpus"] for n in nodes],
                                  eweights=eweights, tpwgts=[frac, 1 - frac])
    chosen = [n for n, p in zip(nodes, parts, strict=True) if p == 0] or [nodes[0]]
    rest = [n for n in nodes if n not in set(chosen)]
    # top up from the nodes best connected to the chosen part, or trim the least connected ones
    link = {n: sum(g.edges[n, m]["bw"] for m in chosen if m != n) for n in nodes}
    have = sum(g.nodes[n]["gpus"] for n in chosen)
    while have < want and rest:
        best = max(rest, key=link.__getitem__)
        chosen.append(best)
        rest.remove(best)
        have += g.nodes[best]["gpus"]
        for n in nodes:
            if n != best:
                link[n] += g.edges[n, best]["bw"]
    while len(chosen) > 1:
        worst = min(chosen, key=link.__getitem__)
        if have - g.nodes[worst]["gpus"] < want:
            break
        chosen.remove(worst)
        have -= g.nodes[worst]["gpus"]
        for n in nodes:
            if n != worst:
                link[n] -= g.edges[n, worst]["bw"]
    return chosen


def place(cluster: Cluster, types: dict[str, GpuType], p: Problem,
          s: Solution) -> tuple[list[NodeAssignment], float, float | None]:
    """Node assignments, the realised weight-sync bandwidth B_sync and the narrowest link between the trainer's
    nodes (None when it has one node), both GB/s per device."""
    g = node_graph(cluster)
    nodes = {n: NodeAssignment(n, d["gpu"], d["gpus"], d["rack"]) for n, d in g.nodes(data=True)}
    c = p.train[s.train]
    of_type = [n for n in g.nodes if g.nodes[n]["gpu"] == c.gpu]
    trainer = _bisect(g, of_type, c.gpus)
    left = c.gpus
    for n in trainer:
        take = min(left, nodes[n].gpus)
        nodes[n].learners, left = take, left - take
    trainer = [n for n in trainer if nodes[n].learners]

    to_trainer = {n: types[nodes[n].gpu].intra_node_gbps if n in trainer else max(g.edges[n, t]["bw"] for t in trainer)
                  for n in nodes}

    groups = sorted(((p.gen[k].tp, p.gen[k].gpu) for k, cnt in s.replicas.items() for _ in range(cnt)), reverse=True)
    for tp, gpu in groups:
        fits = [n for n in nodes.values() if n.gpu == gpu and n.free >= tp]
        if not fits:
            raise ValueError(f"phase 2 cannot place a tp={tp} {gpu} replica: no node has {tp} free devices")
        best = max(fits, key=lambda n: (n.learners > 0 or bool(n.engines), to_trainer[n.name], -n.free))
        best.engines.append(tp)
    engine_nodes = [n for n in nodes.values() if n.engines]
    sync = min((to_trainer[n.name] for n in engine_nodes), default=0.0)
    inner = min((g.edges[a, b]["bw"] for i, a in enumerate(trainer) for b in trainer[i + 1:]), default=None)
    return [n for n in nodes.values() if n.learners or n.engines], sync, inner


def ray_resources(nodes: list[NodeAssignment]) -> dict[str, dict[str, float]]:
    """Per node, the Ray resources it declares: its GPU type's devices and the role slots the plan gives it."""
    out = {}
    for n in nodes:
        res: dict[str, float] = {n.gpu: float(n.gpus)}
        if n.engines:
            res["hexsearch_engine"] = float(len(n.engines))
            res["hexsearch_rollout"] = 1.0
        if n.learners:
            res["hexsearch_learner"] = float(n.learners)
        out[n.name] = res
    return out
