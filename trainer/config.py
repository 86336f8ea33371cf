"""Asynchronous RL configuration (section `train`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainConfig:
    data: str = ""
    """Training questions (QA JSONL). Empty: the train split of the configured world."""
    dev_data: str = ""
    """Dev questions for periodic evaluation. Empty: the world's dev split."""
    steps: int = 50
    """Optimizer steps (weight versions) to train."""
    batch_size: int = 8
    """Questions (groups) per training step; the unit of the staleness rule."""
    group_size: int = 4
    """Trajectories sampled per question (GRPO group)."""
    max_staleness: int = 4
    """Most weight versions a consumed sample may lag behind; 0 is synchronous RL."""
    max_concurrent_rollouts: int = 64
    """Most episodes in flight across all rollout workers."""
    rollout_workers: int = 2
    """Ray rollout worker actors."""
    lr: float = 3e-5
    """Learning rate."""
    advantage: str = "grpo"
    """Group-relative advantage estimator: `grpo`, `rloo` or `drgrpo`."""
    eps_clip: float = 0.2
    """PPO clip epsilon (lower)."""
    eps_clip_high: float = 0.28
    """PPO clip epsilon (upper, DAPO-style clip-higher)."""
    behav_weight_cap: float = 5.0
    """Tokens whose behaviour weight pi_prox/pi_behav exceeds this are masked from the loss."""
    lora_rank: int = 0
    """LoRA rank; 0 trains all weights."""
    lora_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Modules that get LoRA adapters."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    eval_every: int = 5
    """Evaluate on the dev split every N steps (0: only before and after)."""
    save_every: int = 10
    """Checkpoint every N steps (0: only at the end)."""
