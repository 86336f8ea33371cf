"""GPU placement from config: `device=auto` uses the cluster's GPUs, asked-for GPUs that do not exist are a clear
error (checked on this CPU machine), and the learner strategy's config is validated."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hexsearch.config import ConfigError, load_config
from trainer.config import LearnerConfig, RoleResources, TrainConfig
from trainer.placement import actor_device, plan_gpus


def test_auto_gives_learners_and_engines_the_gpus():
    t = TrainConfig(learner_workers=2, engine_replicas=2)
    got = plan_gpus(t, "auto", engines=True, cluster_gpus=8)
    assert (got.learner_resources.num_gpus, got.engine_resources.num_gpus) == (1.0, 1.0)
    shared = plan_gpus(replace(t, learner_workers=1), "auto", engines=True, cluster_gpus=2)  # 3 on 2: half each
    assert (shared.learner_resources.num_gpus, shared.engine_resources.num_gpus) == (0.5, 0.5)
    with pytest.raises(RuntimeError, match="NCCL takes one GPU per learner rank"):
        plan_gpus(t, "auto", engines=True, cluster_gpus=2)  # two learner ranks could land on one GPU
    remote = plan_gpus(t, "auto", engines=False, cluster_gpus=2)  # servers at engine.urls: not ours to place
    assert (remote.learner_resources.num_gpus, remote.engine_resources.num_gpus) == (1.0, 0.0)
    managed = plan_gpus(t, "auto", engines=True, cluster_gpus=8, tp=2)  # 2 started servers of TP 2
    assert (managed.learner_resources.num_gpus, managed.engine_resources.num_gpus) == (1.0, 2.0)
    one_gpu = plan_gpus(replace(t, learner_workers=1, engine_replicas=1), "auto", engines=True, cluster_gpus=1)
    assert (one_gpu.learner_resources.num_gpus, one_gpu.engine_resources.num_gpus) == (0.5, 0.5)
    assert plan_gpus(t, "auto", engines=True, cluster_gpus=0) == t  # a CPU machine: nothing changes
    assert plan_gpus(t, "cpu", engines=True, cluster_gpus=8) == t


def test_gpus_that_do_not_exist_are_a_clear_error():
    t = TrainConfig(learner_workers=2)
    with pytest.raises(RuntimeError, match="engine.device=cuda but the Ray cluster has no GPU"):
        plan_gpus(t, "cuda", engines=True, cluster_gpus=0)
    asks = replace(t, learner_resources=RoleResources(num_gpus=1))
    with pytest.raises(RuntimeError, match="ask for 2 GPUs .* the Ray cluster has 1"):
        plan_gpus(asks, "auto", engines=True, cluster_gpus=1)
    with pytest.raises(RuntimeError, match="need 12 GPUs .* the Ray cluster has 4"):
        plan_gpus(replace(t, learner_workers=8, engine_replicas=4), "auto", engines=True, cluster_gpus=4)


def test_an_actor_asked_for_cuda_on_a_cpu_machine_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert actor_device("auto", "learner") == "cpu"
    with pytest.raises(RuntimeError, match="learner: engine.device=cuda but this actor sees no GPU"):
        actor_device("cuda", "learner")


def test_learner_strategy_config():
    cfg = load_config(None, ["train.learner.strategy=fsdp2", "train.learner_workers=2"])
    assert cfg.train.learner == LearnerConfig(strategy="fsdp2") and cfg.train.learner_workers == 2
    assert load_config(None, []).train.learner.strategy == "ddp"  # configs without the section keep working
    with pytest.raises(ConfigError, match="'train.learner.strategy': 'zero3' is not one of: ddp, fsdp2"):
        load_config(None, ["train.learner.strategy=zero3"])
    from trainer.strategy import LearnerStrategy

    with pytest.raises(ValueError, match="cpu_offload=true offloads GPU memory"):
        LearnerStrategy(LearnerConfig(strategy="fsdp2", cpu_offload=True), 2, "cpu", bf16=False, decoder_layers=[])
