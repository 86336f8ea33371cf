"""Asynchronous RL configuration (section `train`).

Units, used consistently everywhere: the staleness rule counts **groups** (one question x
`group_size` trajectories); the concurrency cap counts **episodes** (what loads the engines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from core.ranges import ranged

if TYPE_CHECKING:
    from agent.config import AgentConfig
    from core.rundir import RunConfig
    from serving.config import EngineConfig
    from tools.config import ToolsConfig
    from trainer.planner.config import PlanConfig
    from trainer.sft_config import SFTConfig
    from world.config import WorldConfig

LrSchedule = Literal["constant", "cosine"]
Advantage = Literal["grpo", "rloo", "drgrpo"]
FilterGroups = Literal["drop", "reject", "none"]
ProxLogp = Literal["recompute", "loglinear"]
Packing = Literal["pad", "concat"]
LossAgg = Literal["token-mean", "seq-mean-token-mean"]
Strategy = Literal["ddp", "fsdp2"]
WeightTransfer = Literal["disk", "adapter", "nccl"]


@dataclass
class LearnerConfig:
    """How the learner ranks (`train.learner_workers`) share the model (trainer/strategy.py, docs/scale-out.md)."""

    strategy: Strategy = "ddp"
    """`ddp`: every rank holds the whole model and optimizer, gradients are summed by PyTorch
    DistributedDataParallel. `fsdp2`: parameters, gradients and AdamW state are sharded over the ranks
    (`torch.distributed.fsdp.fully_shard` per decoder layer), ~1/N of the memory per rank. With one rank
    both train the plain model."""
    reshard_after_forward: bool = True
    """`fsdp2`: free each layer's gathered weights after its forward (gather again in backward): least
    memory. False keeps them until the backward: one all-gather less per layer and step."""
    cpu_offload: bool = False
    """`fsdp2` on GPUs: keep the sharded parameters, gradients and optimizer state in CPU memory (the
    optimizer step runs on CPU); for models that do not fit even sharded. An error on a CPU learner."""


@dataclass
class RoleResources:
    """What one Ray actor of a role asks the scheduler for (placement from config)."""

    num_cpus: float = 1.0
    """Logical CPUs reserved for the actor (inside it, torch uses `threads` or this many threads)."""
    num_gpus: float = 0.0
    """GPUs reserved for the actor (fractions allowed, e.g. 0.5 to colocate two roles on one GPU)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources, e.g. {"H100": 1} to pin a role to a GPU type, or {"node:10.0.0.2": 0.01}."""
    threads: int = 0
    """Torch CPU threads inside the actor (0: `num_cpus`, at least 1)."""


@dataclass
class TrainConfig:
    workflow: str = "search_agent"
    """The episode workflow rollout workers and dev evaluation run: `search_agent` (agent.workflow),
    `openai_agent` (your own agent program, `agent.program` / `agent.command`; setting either selects it) or
    an import path `package.module:Class` of a `Workflow` subclass (docs/extending.md)."""
    data: str = ""
    """Training questions (QA JSONL). Empty: the train split of the configured world."""
    dev_data: str = ""
    """Dev questions for periodic evaluation. Empty: the world's dev split."""
    bucket_weights: dict[str, int] = field(default_factory=dict)
    """The training mix: each difficulty bucket's (hops1.., n2..; agent.qa.question_bucket) share of the
    questions, relative to the others (default 1 each; 0 leaves a bucket out, and may name one the world
    lacks), e.g. `{hops2: 4, hops3: 4}`.
    The mix keeps as many whole rounds as its scarcest bucket fills (trainer.runtime.mix_buckets). Why: a
    bucket the policy already solves yields groups that dynamic filtering drops, and a lineage group of 32
    searches costs the learner many times a 2-hop group; empty: every question once."""
    eval_suite: str = ""
    """Score the periodic dev evaluation as an `hexsearch eval` suite (`world-dev`, `localqa`, `gaia`, `frames`, ...):
    its loader reads `dev_data` and its rule-based scorers are logged as `eval/<scorer>` (eval/runner.py).
    Empty: the dev QA file (or the world's dev split), scored by the reward."""
    init_from: str = ""
    """A `hexsearch sft` (or train) run folder whose best checkpoint's weights this run starts from: learner
    and engines both (the checkpoint is exported once to `<that run>/artifacts/policy-step-N/`, which becomes
    `engine.model`); the optimizer is fresh and the version starts at 0. Empty: the base `engine.model`."""
    reuse_init_eval: bool = True
    """With `init_from`: the dev evaluation before training is that run's own evaluation of the checkpoint this
    run starts from, not a repeat of it, when it was made the same way: greedy, on the same dev questions, with
    the same agent, tools, world and engine settings, `engine.model` and the rollouts' `agent.temperature`
    aside (trainer/init_from.py: inherited_dev_eval). False, or anything different: evaluate again."""
    steps: int = 50
    """Optimizer steps (weight versions) to train."""
    time_budget_min: float = 0.0
    """Stop starting new steps after this many minutes of wall clock (setup included; 0: no budget), and
    do not start one whose batch would end past it at the learner's tokens/s measured so far. The final
    evaluation still runs, so leave it a minute or two below a hard deadline. results.json's `stopped`
    says why a run ended before `steps`."""
    batch_size: int = ranged(8, ge=1)
    """Questions (groups) per training step; the unit of the staleness rule."""
    group_size: int = ranged(4, ge=1)
    """Trajectories sampled per question (GRPO group)."""
    max_staleness: int = 4
    """Most weight versions a consumed sample may lag behind; 0 is synchronous RL."""
    max_inflight_trajectories: int = ranged(64, ge=1)
    """Most trajectories (single episodes, not groups) in flight across all rollout workers: a group of
    `group_size` is admitted whole while (running groups + 1) x group_size <= this. ASearcher's
    `max_concurrent_rollouts` counts groups: its 24 x n_trajs 16 is 384 here. Loading warns when this admits
    fewer than one step's batch_size x group_size, or fewer than the engines can batch. Was
    `max_concurrent_episodes` (still loads, with a warning)."""
    rollout_workers: int = ranged(2, ge=1)
    """Ray rollout worker actors."""
    worker_concurrency: int = ranged(64, ge=1)
    """Most episodes one rollout worker runs at once on its asyncio loop (rollout_workers x this also caps the
    trajectories in flight)."""
    engine_replicas: int = ranged(1, ge=1)
    """Embedded engine actors (requests are routed to one of them by request id, so a trajectory stays on one)."""
    learner_workers: int = ranged(1, ge=1)
    """Data-parallel learner processes (torch.distributed: gloo on CPU, NCCL on GPU)."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """How the learner ranks share the model: `ddp` or `fsdp2` (`train.learner.strategy`), sharding options."""
    lr: float = ranged(3e-5, gt=0)
    """Learning rate (AdamW)."""
    lr_warmup_steps: int = 0
    """Linear warm-up steps of the learning rate."""
    lr_schedule: LrSchedule = "constant"
    """After warm-up: `constant` or `cosine` (to 10% of `lr` at `steps`)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    advantage: Advantage = "grpo"
    """Group-relative advantage estimator: `grpo` ((r-mean)/(std+eps)), `rloo` (leave-one-out) or `drgrpo` (r-mean)."""
    filter_groups: FilterGroups = "drop"
    """Zero-variance groups: `reject` (at completion; frees the slot, steps wait for B useful groups),
    `drop` (counted in the step's B groups, left out of the loss: variable-size batches) or `none`."""
    eps_clip: float = ranged(0.2, gt=0, le=1, at_most="eps_clip_high")
    """PPO clip epsilon (lower)."""
    eps_clip_high: float = 0.28
    """PPO clip epsilon (upper, DAPO-style clip-higher)."""
    loss_agg: LossAgg = "token-mean"
    """How the per-token losses of a batch add up (verl's `loss_agg_mode`): `token-mean` (every policy token
    of the batch weighs the same, AReaL/DAPO: a 400-token episode outweighs a 40-token one ten times) or
    `seq-mean-token-mean` (each episode's token-mean, averaged over episodes: every episode weighs the same,
    however long; a trajectory's segments count as one episode). trainer/loss.py has the formula."""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss subtracts `entropy_coef` x the token-mean policy entropy (0: off)."""
    behav_weight_cap: float = 5.0
    """Tokens whose behaviour weight pi_prox/pi_behav exceeds this are masked from the loss (0: no cap)."""
    prox_logp: ProxLogp = "recompute"
    """How pi_prox is obtained: `recompute` (forward pass with the pre-step weights) or `loglinear`
    (interpolated from behaviour and current log-probs by version, AReaL's approximation)."""
    minibatches: int = ranged(1, ge=1)
    """Optimizer steps per training batch (PPO minibatches). With 1, pi_prox comes free from the update's own forward."""
    micro_batch_tokens: int = ranged(2048, ge=1)
    """Token budget of one packed micro-batch (sequences are packed first-fit-decreasing into micro-batches)."""
    packing: Packing = "pad"
    """Micro-batch layout: `pad` (rows padded to the longest, sorted by length; fastest with CPU SDPA) or
    `concat` (sequences concatenated in one row with restarting position ids: block-diagonal attention)."""
    share_prefix: bool = True
    """Forward the prefix all rows of a micro-batch share (system prompt, a group's question) once and
    reuse its keys/values for every row (`pad` packing; exact, ~35% less compute for G=4 groups). With
    several micro-batches, the prefix all samples of a step share runs once for all of them."""
    lora_rank: int = 0
    """LoRA rank; 0 trains all weights."""
    lora_alpha: float = 32.0
    """LoRA alpha (scale = alpha / rank)."""
    lora_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Modules that get LoRA adapters."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Learner forward precision over its fp32 master weights: `auto` (bf16 autocast where the device runs it
    fast: a GPU or a CPU with AVX512_BF16; else fp32), `fp32` (exact, the same on every machine) or `bf16`.
    Under `fsdp2` a bf16 forward is FSDP's mixed-precision policy (bf16 compute, fp32 gradient reduction)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute); activation checkpointing
    per decoder layer under every learner strategy."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0: off)."""
    eval_every: int = 5
    """Evaluate on the dev split every N steps (0: only before and after)."""
    eval_questions: int = 32
    """Dev questions per evaluation (the first N of the dev split; the same ones every time)."""
    eval_temperature: float = 0.0
    """Sampling temperature of dev evaluation (0: greedy)."""
    eval_seed: int = 1234
    """Sampling seed of dev evaluation, so before/after compare the same questions under the same seed."""
    save_every: int = 10
    """Checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = ranged(2, ge=1)
    """Most recent checkpoints kept on disk."""
    ray_address: str = ""
    """Ray cluster to join (`auto`, `ray://host:10001`, `host:6379`). Empty: start a local Ray."""
    engine_resources: RoleResources = field(default_factory=RoleResources)
    """Placement of each embedded engine actor."""
    learner_resources: RoleResources = field(default_factory=RoleResources)
    """Placement of each learner actor."""
    rollout_resources: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=0.0, threads=1))
    """Placement of each rollout worker actor (asyncio and tool I/O: needs little CPU)."""
    judge_resources: RoleResources = field(default_factory=lambda: RoleResources(num_cpus=0.0, threads=1))
    """Placement of the LLM judge's engine actor, started when `agent.reward_fn=judge` with the `embedded`
    judge backend (every rollout worker reaches it; remote judge backends need no actor)."""
    weight_transfer: WeightTransfer = "disk"
    """How vLLM/SGLang servers get each new version: `disk` (the learner saves the merged model, the servers reload
    it), `adapter` (LoRA runs on vLLM: only the adapter is saved and loaded) or `nccl` (learner rank 0 broadcasts
    the weights to the servers' GPUs: vLLM's weight-transfer engine, which must be importable in the learner's
    process, or SGLang's distributed update; learners on GPUs; serving/remote/weight_transfer.py).
    Embedded engines always take the weights in memory."""
    weight_sync_timeout_s: float = ranged(600.0, gt=0)
    """Most seconds each weight-sync phase (pause, load, resume) may take on the engines; an engine that does
    not answer stops the run with an error naming it, instead of a silent hang."""
    max_question_attempts: int = ranged(3, ge=1)
    """Times one question's group is run when an episode ends for an infrastructure reason (`engine_error`,
    `engine_abort`, `agent_error`): such a group is lost, never trained on, and its question re-queued up to
    this many runs, then skipped (logged as `skip` in rollouts.jsonl)."""
    max_consecutive_failures: int = ranged(20, ge=1)
    """Failed groups in a row (an infrastructure stop reason, or the episode code raised) after which
    training stops with an error naming the last failure, instead of admitting questions forever."""
    worker_max_restarts: int = 3
    """Times Ray restarts a crashed rollout worker; its lost groups are re-run."""
    engine_max_restarts: int = 3
    """Times Ray restarts a dead embedded engine actor; it serves again only after the engine supervisor gave it
    the current weights and version (its in-flight episodes are lost groups, re-run)."""
    engine_health_interval_s: float = 5.0
    """Seconds between the engine supervisor's checks of every engine actor (0: no supervision)."""
    engine_health_timeout_s: float = ranged(120.0, gt=0)
    """An engine actor that does not answer its health check within this is hung: reported and replaced. One that
    stays down this long (restarts spent) stops the run."""
    learner_max_restarts: int = 1
    """Times a run whose learner actor died restarts from its newest checkpoint, in the same process (as
    `--resume` would); without a checkpoint, or when spent, the run stops with an error naming the rank."""
    learner_step_timeout_s: float = ranged(3600.0, gt=0)
    """Most seconds one learner call (a training step, a weight export, a checkpoint) may take; a learner that
    does not answer is treated as dead (see `learner_max_restarts`), never waited on silently."""
    tensorboard: bool = True
    """Write TensorBoard event files to `<run>/tb`."""
    wandb: bool = False
    """Also log to Weights & Biases (when installed)."""
    wandb_project: str = "hexsearch"
    """W&B project name."""
    save_trajectories: bool = True
    """Append every consumed trajectory to `<run>/trajectories/train.jsonl`."""


class FullConfig(Protocol):
    """The whole config as the trainer reads it: hexsearch.config.HexConfig, whose package (the CLI) sits above
    the trainer; it also serves where the trainer hands the config on (agent.config.WorkflowConfig)."""

    run: RunConfig
    engine: EngineConfig
    tools: ToolsConfig
    agent: AgentConfig
    world: WorldConfig
    train: TrainConfig
    sft: SFTConfig
    plan: PlanConfig
