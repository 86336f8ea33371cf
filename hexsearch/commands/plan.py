"""`hexsearch plan`: plan GPU placement for a heterogeneous cluster (MILP + graph partitioning).

    hexsearch plan --cluster C --model M --workload W [--budget B | --target T] --out plan.yaml [--base recipe.yaml]
    hexsearch plan profile [CONFIG] [key=value ...] --out configs/planner/clusters/this-cpu.yaml

The plan file is a config overlay: `hexsearch train plan.yaml` places its actors as planned.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, UserError, config_from_cli


def run_plan(config: str | None, overrides: list[str] | None, cluster: str | None, model: str | None,
             workload: str | None, budget: float | None, target: float | None, out: str | None,
             base: str | None, simulate: bool) -> str:
    """Plan, write the plan file when `out` is given, and return the explanation text."""
    from trainer.planner.planner import Infeasible, load_inputs, make_plan
    from trainer.planner.specs import SpecError

    extra = [f"plan.{k}={v}" for k, v in (("cluster", cluster), ("model", model), ("workload", workload),
                                          ("budget_per_hour", budget), ("target_samples_per_s", target))
             if v is not None]
    cfg = config_from_cli(config, [*(overrides or []), *extra])
    if cfg.plan.budget_per_hour > 0 and cfg.plan.target_samples_per_s > 0:
        raise UserError("give either --budget (maximise throughput) or --target (minimise cost), not both")
    try:
        inputs = load_inputs(cfg.plan)
        result = make_plan(inputs, simulate_plan=simulate)
    except (SpecError, Infeasible) as e:
        raise UserError(f"plan: {'infeasible: ' if isinstance(e, Infeasible) else ''}{e}") from None
    text = "\n".join(result.explanation)
    if out:
        from trainer.planner.planfile import write

        path = write(inputs, result, out, base)
        text += f"\nplan file: {path}  (hexsearch train {path})"
    return text


def run_profile(config: str | None, overrides: list[str] | None, out: str, prompt_tokens: int,
                train_tokens: int, batch: int, name: str, shared_prefix: int = 0, policy_tokens: int = 0) -> str:
    """Measure engine and learner speed here and write a one-node cluster file of this machine."""
    from trainer.planner.profile import device_yaml, profile_device

    cfg = config_from_cli(config, overrides)
    speed = profile_device(cfg, prompt_tokens, train_tokens, batch, shared_prefix, policy_tokens)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(device_yaml(name, speed, os.cpu_count() or 1))
    return (f"{name}: decode {speed.decode_base_s * 1e3:.1f} ms/step at batch 1, +{speed.decode_per_seq_s * 1e3:.2f} "
            f"ms per extra sequence (to batch {speed.max_batch}); prefill {speed.prefill_tokens_per_s:.0f} tokens/s; "
            f"training {speed.train_tokens_per_s:.0f} tokens/s + {speed.train_fixed_s:.1f}s per step; weight sync "
            f"{speed.weight_sync_s:.2f}s\nwrote {out}")


def register(app: typer.Typer) -> None:
    @app.command("plan", help="Plan GPU placement for a heterogeneous cluster (MILP + graph partitioning); "
                 "`hexsearch plan profile` measures this machine.")
    def _cmd(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG,
             cluster: str = typer.Option(None, "--cluster", help="Cluster YAML (configs/planner/clusters/)."),
             model: str = typer.Option(None, "--model", help="Model YAML (configs/planner/models/)."),
             workload: str = typer.Option(None, "--workload", help="Workload YAML (configs/planner/workloads/)."),
             budget: float = typer.Option(None, "--budget", help="Dollars per hour; maximise throughput under it."),
             target: float = typer.Option(None, "--target", help="Trained samples/s; minimise cost to reach it."),
             out: str = typer.Option(None, "--out", help="Write the plan file (a config overlay for hexsearch train)."),
             base: str = typer.Option(None, "--base", help="Recipe the plan file extends (e.g. configs/quickstart.yaml)."),
             simulate: bool = typer.Option(True, "--simulate/--no-simulate", help="Evaluate the plan by simulation."),
             prompt_tokens: int = typer.Option(320, "--prompt-tokens", help="profile: prompt tokens per request."),
             train_tokens: int = typer.Option(400, "--train-tokens", help="profile: tokens per training sequence."),
             batch: int = typer.Option(16, "--batch", help="profile: largest decode batch measured."),
             shared_prefix: int = typer.Option(0, "--shared-prefix-tokens",
                                               help="profile: prompt tokens all training sequences share."),
             policy_tokens: int = typer.Option(0, "--policy-tokens",
                                               help="profile: policy (loss) tokens per training sequence; the rest "
                                                    "after the prompt are tool results (0: all of it)."),
             name: str = typer.Option("cpu", "--name", help="profile: device type name."),
             ) -> None:
        if config == "profile":
            rest = list(overrides or [])
            cfg_path = rest.pop(0) if rest and "=" not in rest[0] else None
            typer.echo(run_profile(cfg_path, rest, out or "configs/planner/clusters/this-cpu.yaml", prompt_tokens,
                                   train_tokens, batch, name, shared_prefix, policy_tokens))
            return
        typer.echo(run_plan(config, overrides, cluster, model, workload, budget, target, out, base, simulate))
