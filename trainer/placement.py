"""Ray setup and per-role placement from config (what a cluster plan drives).

`init_ray` joins `train.ray_address` when set (an existing cluster: `auto`, `host:6379`,
`ray://host:10001`) or starts a local Ray sized so the configured roles fit. Each role's
`RoleResources` becomes the actor options `num_cpus`, `num_gpus` and `resources` (custom Ray
resources, e.g. {"H100": 1} to pin learners to H100 nodes).
"""

from __future__ import annotations

import os
from typing import Any

from trainer.config import RoleResources, TrainConfig


def ray_options(role: RoleResources) -> dict[str, Any]:
    """Actor options for one role."""
    opts: dict[str, Any] = {"num_cpus": role.num_cpus, "num_gpus": role.num_gpus}
    if role.resources:
        opts["resources"] = dict(role.resources)
    return opts


def role_threads(role: RoleResources) -> int:
    """Torch threads inside an actor of this role."""
    return role.threads if role.threads > 0 else max(1, int(role.num_cpus))


def requested_cpus(cfg: TrainConfig, embedded: bool, judge_actor: bool = False) -> float:
    """Logical CPUs all roles ask for together."""
    total = cfg.learner_workers * cfg.learner_resources.num_cpus + cfg.rollout_workers * cfg.rollout_resources.num_cpus
    if embedded:
        total += cfg.engine_replicas * cfg.engine_resources.num_cpus
    if judge_actor:
        total += cfg.judge_resources.num_cpus
    return total


def requested_resources(cfg: TrainConfig, embedded: bool, judge_actor: bool = False) -> dict[str, float]:
    """Custom resources all roles ask for together (a plan's `hexsearch_engine` slots, device types, ...):
    a local Ray declares them, so a plan made for a cluster also runs on this one machine."""
    roles = [(cfg.learner_workers, cfg.learner_resources), (cfg.rollout_workers, cfg.rollout_resources)]
    if embedded:
        roles.append((cfg.engine_replicas, cfg.engine_resources))
    if judge_actor:
        roles.append((1, cfg.judge_resources))
    total: dict[str, float] = {}
    for count, role in roles:
        for name, amount in role.resources.items():
            total[name] = total.get(name, 0.0) + count * amount
    return total


def init_ray(cfg: TrainConfig, embedded: bool = True, judge_actor: bool = False) -> None:
    """Join the configured cluster or start a local one (idempotent)."""
    import ray

    if ray.is_initialized():
        return
    # Ray starts workers at niceness 15; here the workers *are* the job (engines, learners), so on a
    # shared machine they must not yield to every other process.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # OpenMP threads that spin while waiting are ruinous when cores are shared (two torch processes
    # on 2 cores ran decoding ~10x slower); passive waiting costs little on dedicated cores.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Every actor loads a model or tokenizer; their "Loading weights" bars would bury the run's own progress.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env = {"env_vars": {k: os.environ[k] for k in ("HEXSEARCH_CACHE", "HEXSEARCH_QUIET", "HF_HUB_OFFLINE",
                                                   "TOKENIZERS_PARALLELISM", "RAY_AUTH_MODE", "OMP_WAIT_POLICY",
                                                   "HF_HUB_DISABLE_PROGRESS_BARS",
                                                   # a token and auth-proxy statement the user gave (serving/launch/servers.py)
                                                   "HEXSEARCH_ENGINE_TOKEN", "HEXSEARCH_AUTH_PROXY")
                        if k in os.environ}}
    # Components named by import path (`my_rewards:score`) are imported inside the workers: the folder the
    # run was started from is importable there, as it is in the driver.
    env["env_vars"]["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, runtime_env=env, log_to_driver=True)
        return
    # Local: logical CPUs are bookkeeping, not threads; declare enough for the configured roles.
    cpus = max(float(os.cpu_count() or 1), requested_cpus(cfg, embedded, judge_actor))
    # Ray's token authentication stays on (its default): nothing joins or calls the cluster without the token.
    # And nothing outside this machine reaches it: Ray's GCS, raylet, object manager, workers and agents listen on
    # 127.0.0.1 exactly when the node IP is 127.0.0.1 (gcs_server.cc: `config.node_ip_address == "127.0.0.1"`,
    # dashboard/agent.py: `is_localhost(self.ip)`), and otherwise on every interface. Ray takes 127.0.0.1 as the
    # node IP only where clusters are off, as on macOS and Windows (services.get_node_ip_address:
    # `not ray_constants.ENABLE_RAY_CLUSTER`); `_node_ip_address="127.0.0.1"` alone is turned back into the LAN IP
    # (services.resolve_ip_for_localhost). The flag is read when ray is imported: set for the Ray processes and
    # anything that joins from here, and in this process for the start only.
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    clusters, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        # address="local": without it ray.init joins the newest cluster `ray start` left on this machine
        # (services.get_ray_address_from_environment) instead of starting the run's own.
        ray.init(address="local", num_cpus=int(cpus + 0.999), include_dashboard=False, runtime_env=env, log_to_driver=True,
                 configure_logging=False, resources=requested_resources(cfg, embedded, judge_actor) or None)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = clusters


def requested_gpus(cfg: TrainConfig, engines: bool) -> float:
    """GPUs the learner and (when they hold GPUs: embedded or managed servers) engine roles ask for together."""
    return cfg.learner_workers * cfg.learner_resources.num_gpus + (
        cfg.engine_replicas * cfg.engine_resources.num_gpus if engines else 0.0)


def plan_gpus(cfg: TrainConfig, device: str, engines: bool, cluster_gpus: float, tp: int = 1) -> TrainConfig:
    """The roles' GPUs from `engine.device` and the GPUs of the Ray cluster, or a clear error.

    `engines`: the engine replicas hold GPUs (embedded engines, or servers `hexsearch train` starts, each of
    `tp` GPUs). `auto` with GPUs in the cluster and no role asking for any: each learner rank and each engine
    gets its GPUs (half a GPU each when there are not enough for all and tp is 1). GPUs asked for (`cuda`, or
    a role's `num_gpus`) that the cluster does not have are an error here, never actors that wait for
    resources forever or run on CPU instead."""
    asked = requested_gpus(cfg, engines)
    if device.startswith("cuda") and cluster_gpus == 0:
        raise RuntimeError(f"engine.device={device} but the Ray cluster has no GPU (torch sees "
                           f"{_visible_gpus()}); use engine.device=auto or cpu, or join a GPU cluster (train.ray_address)")
    if asked > cluster_gpus:
        raise RuntimeError(f"the roles ask for {asked:g} GPUs (learner_workers x learner_resources.num_gpus + engine_replicas "
                           f"x engine_resources.num_gpus) but the Ray cluster has {cluster_gpus:g}")
    if device == "cpu" or asked > 0 or cluster_gpus == 0:
        return cfg
    from dataclasses import replace

    units = cfg.learner_workers + (cfg.engine_replicas * tp if engines else 0)
    share = 1.0 if units <= cluster_gpus else 0.5 if units <= 2 * cluster_gpus and tp == 1 else 0.0
    if share == 0.0:
        raise RuntimeError(f"engine.device={device}: {cfg.learner_workers} learner ranks and {cfg.engine_replicas} engine "
                           f"replicas of {tp} GPU(s) need {units} GPUs (or half of one each); the Ray cluster has "
                           f"{cluster_gpus:g}")
    if share < 1 and cfg.learner_workers > 1:  # Ray may pack two half-GPU learners onto one GPU
        raise RuntimeError(f"engine.device={device}: {units} actors on {cluster_gpus:g} GPUs would share GPUs, and NCCL "
                           f"takes one GPU per learner rank; lower train.learner_workers ({cfg.learner_workers}) or "
                           "train.engine_replicas, or set the roles' num_gpus")
    return replace(cfg, learner_resources=replace(cfg.learner_resources, num_gpus=share),
                   engine_resources=replace(cfg.engine_resources, num_gpus=share * tp if engines else 0.0))


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def actor_device(want: str, role: str) -> str:
    """The torch device inside an actor: `auto` is cuda when the actor was given a GPU, else cpu; `cuda`
    (or `cuda:N`) where the actor sees no GPU is an error naming the role, never a silent CPU run."""
    import torch

    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"{role}: engine.device={want} but this actor sees no GPU (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}); give the role GPUs "
                           f"(train.{role}_resources.num_gpus) or use engine.device=auto")
    return want
