"""Learner strategies on CPU with gloo: 2 ranks under ddp and fsdp2 train like one learner on the whole
batch (loss terms, gradient norm, updated weights), the fsdp2 export is the full state dict, and a sharded
checkpoint written by 2 ranks resumes on 1 rank and on 2 (then takes the same next step).

`HEXSEARCH_TEST_DEVICE=cuda` runs the same on 2 GPUs with NCCL (scripts/gpu_check.sh)."""

from __future__ import annotations

import os
import socket
from dataclasses import replace

import pytest
import torch

from trainer import learner_state
from trainer.config import LearnerConfig, TrainConfig
from trainer.learner import Learner
from trainer.learner_group import split_by_tokens

DEVICE = os.environ.get("HEXSEARCH_TEST_DEVICE", "cpu")
CFG = TrainConfig(precision="fp32", lr=1e-2, grad_clip=0.5, micro_batch_tokens=96)
"""Small micro-batches: each rank runs several, and not the same number (the lockstep dummies are exercised)."""


def _samples(seed: int = 0):
    from test_learner import _grouped_samples, _samples

    return _samples(7, seed) + _grouped_samples(2, 2, seed)  # odd count, and rows sharing prefixes


def _cfg(strategy: str) -> TrainConfig:
    return replace(CFG, learner=LearnerConfig(strategy=strategy))


def _rank(rank: int, world: int, port: int, spec: str, ckpt: str, out: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = "cpu" if DEVICE == "cpu" else f"cuda:{rank}"
    if device != "cpu":
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if device == "cpu" else "cpu:gloo,cuda:nccl",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for strategy in ("ddp", "fsdp2"):
        learner = Learner(_cfg(strategy), spec, device=device, rank=rank, world_size=world)
        stats = learner.train_step(split_by_tokens(_samples(), world)[rank], version=0)
        exported = learner.export_weights()  # every rank takes part; rank 0 gets the whole state dict
        if strategy == "fsdp2":
            sharded = {n: p.to_local().numel() for n, p in learner.model.named_parameters()}
            learner_state.save(learner, ckpt)
            resumed = Learner(_cfg("fsdp2"), spec, device=device, rank=rank, world_size=world)
            learner_state.load(resumed, ckpt)  # 2 ranks -> 2 ranks
            second = resumed.train_step(split_by_tokens(_samples(1), world)[rank], version=1)
            after = resumed.export_weights()
        if rank == 0:
            out[strategy] = {"stats": stats, "weights": exported}
    if rank == 0:
        out["sharded_numel"], out["second"], out["after"] = sharded, second, after
    else:
        out["rank1_export"] = len(exported)
    dist.destroy_process_group()


def test_ddp_and_fsdp2_on_two_ranks_equal_one_learner_and_resume_on_one(tiny_model_spec, tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(2, port, tiny_model_spec, str(tmp_path), out), nprocs=2, join=True)

    single = Learner(CFG, tiny_model_spec, device=DEVICE)
    ref = single.train_step(_samples(), version=0)
    want = single.export_weights()
    moved = [k for k in want if not torch.equal(want[k], Learner(CFG, tiny_model_spec, device=DEVICE).export_weights()[k])]
    assert moved, "the step must change the weights for the comparison to mean anything"
    for strategy in ("ddp", "fsdp2"):
        got = out[strategy]
        assert got["stats"]["train/policy_tokens"] == ref["train/policy_tokens"]
        for name in ("train/grad_norm", "train/approx_kl", "train/clip_frac", "train/logp_mismatch", "train/entropy"):
            assert got["stats"][name] == pytest.approx(ref[name], rel=1e-4, abs=1e-6), (strategy, name)
        assert set(got["weights"]) == set(want)  # fsdp2: the gathered export is the full state dict
        for k, v in want.items():
            assert torch.allclose(got["weights"][k], v, atol=2e-6), (strategy, k)
    full = {n: p.numel() for n, p in single.model.named_parameters()}
    assert sum(out["sharded_numel"].values()) * 2 == pytest.approx(sum(full.values()), rel=0.01)  # half per rank
    assert out["rank1_export"] == 0  # the other ranks only take part in the gathers

    # the 2-rank fsdp2 checkpoint resumes on one plain learner and on 2 fsdp2 ranks: same next step as
    # the learner that never stopped (restored AdamW moments change that step; zero ones would not match)
    one = Learner(CFG, tiny_model_spec, device=DEVICE)
    learner_state.load(one, tmp_path)
    assert all(torch.allclose(v, want[k], atol=2e-6) for k, v in one.export_weights().items())
    assert one.scheduler.last_epoch == 1 and len(one.optimizer.state) == len(one.params)
    ref2 = single.train_step(_samples(1), version=1)
    got1 = one.train_step(_samples(1), version=1)
    want2 = single.export_weights()
    for stats, weights in ((got1, one.export_weights()), (out["second"], out["after"])):
        assert stats["train/grad_norm"] == pytest.approx(ref2["train/grad_norm"], rel=1e-4)
        for k, v in want2.items():
            assert torch.allclose(weights[k], v, atol=5e-6), k
