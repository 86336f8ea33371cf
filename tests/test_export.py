"""`hexsearch export`: a checkpoint's policy as a Hugging Face folder (tiny random Llama), and how
`hexsearch ask` picks its model (the newest `make demo` run, else the quickstart recipe)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hexsearch.commands.common import UserError
from hexsearch.commands.export import export_run, newest_demo_run
from trainer import checkpoint, learner_state
from trainer.config import TrainConfig
from trainer.learner import Learner


def _trained_run(root: Path, name: str, cfg: TrainConfig, *, legacy: bool = False,
                 state: dict | None = None) -> tuple[Path, Learner]:
    """A run folder whose checkpoint holds weights the base model does not have (as if trained)."""
    learner = Learner(cfg, "tiny-random")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in learner.params:
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    run = root / name
    run.mkdir(parents=True)
    lora = f"  lora_rank: {cfg.lora_rank}\n  lora_alpha: {cfg.lora_alpha}\n  lora_modules: [q_proj, v_proj]\n"
    (run / "config.yaml").write_text(f"engine:\n  model: tiny-random\ntrain:\n{lora}")
    tmp = checkpoint.begin(run / "checkpoints", 3)
    if legacy:  # an earlier hexsearch's learner.pt
        torch.save({"params": learner.trainable_state(), "optimizer": learner.optimizer.state_dict()}, tmp / "learner.pt")
    else:
        learner_state.save(learner, tmp)
    checkpoint.commit(tmp, 3, state or {"step": 3}, [])
    return run, learner


def _logits(model, ids=(1, 9690, 198, 21350, 2029)) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits.float()


def test_full_finetune_exports_a_loadable_hf_folder(tmp_path):
    from transformers import AutoTokenizer

    from serving.models import load_model

    run, learner = _trained_run(tmp_path, "train-full", TrainConfig(precision="fp32"), legacy=True)
    out = export_run(run, tmp_path / "hf", dtype="float32")
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "hexsearch_export.json"):
        assert (out / name).exists(), name
    assert AutoTokenizer.from_pretrained(out).chat_template  # the chat template travels with it
    exported = load_model(str(out), dtype="float32")  # what engine.model=<folder> loads
    assert torch.allclose(_logits(exported), _logits(learner.model), atol=1e-4)
    assert not torch.allclose(_logits(exported), _logits(load_model("tiny-random", dtype="float32")), atol=1e-3)
    assert json.loads((out / "hexsearch_export.json").read_text())["step"] == "step-3"
    with pytest.raises(UserError, match="exists and is not empty"):
        export_run(run, out)


def test_lora_is_merged_or_kept_as_an_adapter(tmp_path):
    from peft import PeftModel

    from serving.models import load_model

    cfg = TrainConfig(precision="fp32", lora_rank=4, lora_alpha=8.0, lora_modules=["q_proj", "v_proj"])
    run, learner = _trained_run(tmp_path, "train-lora", cfg)  # the sharded (DCP) checkpoint format
    want = _logits(learner.model)
    merged = load_model(str(export_run(run, tmp_path / "merged", dtype="float32")), dtype="float32")
    assert torch.allclose(_logits(merged), want, atol=1e-4)
    adapter = export_run(run, tmp_path / "adapter", adapter=True)
    assert (adapter / "adapter_config.json").exists() and (adapter / "adapter_model.safetensors").exists()
    loaded = PeftModel.from_pretrained(load_model("tiny-random", dtype="float32"), str(adapter))
    assert torch.allclose(_logits(loaded), want, atol=1e-4)


def test_bad_checkpoints_are_one_line_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, "-m", "hexsearch.cli", "export", str(tmp_path / "empty"), "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("hexsearch: ") and "not a run folder" in proc.stderr
    run = tmp_path / "train-x"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("engine:\n  model: tiny-random\n")
    with pytest.raises(UserError, match="no valid checkpoint"):
        export_run(run, tmp_path / "o")


def _demo_like(root: Path, name: str, model: str = "smollm2-135m-instruct") -> Path:
    run = root / name
    (run / "checkpoints" / "step-1").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step-1")
    world = "world:\n  entities: 200\n  max_hops: 1\n  short_articles: true\n"
    (run / "config.yaml").write_text(f"engine:\n  model: {model}\n  backend: embedded\n{world}")
    return run


def test_ask_uses_the_newest_demo_run_and_says_so(tmp_path, monkeypatch, capsys):
    import os
    import time

    from hexsearch.commands import ask, export

    assert newest_demo_run(tmp_path) is None
    old, new = _demo_like(tmp_path, "train-1"), _demo_like(tmp_path, "train-2")
    _demo_like(tmp_path, "train-3", model="tiny-random")  # another recipe: not a demo run
    _demo_like(tmp_path, "i18-experiment")  # not named by `hexsearch demo`
    os.utime(old / "checkpoints" / "latest", (time.time() - 100, time.time() - 100))
    assert newest_demo_run(tmp_path) == new
    monkeypatch.setattr(export, "demo_export", lambda run: (run / "artifacts" / "hf-step-1", "step-1"))
    cfg = ask._ask_config(None, [f"run.root={tmp_path}"], None, quiet=False)
    assert cfg.engine.model == str(new / "artifacts" / "hf-step-1") and cfg.agent.temperature == 0
    assert cfg.run.name == "" and "using the model you trained" in capsys.readouterr().err
    cfg = ask._ask_config(None, [f"run.root={tmp_path / 'none'}"], None, quiet=False)  # no demo run: the recipe
    assert cfg.engine.model == "smollm2-135m-instruct" and cfg.agent.prefill == "tags" and cfg.world.entities == 200
    assert "quickstart's prompt recipe" in capsys.readouterr().err
    cfg = ask._ask_config(None, [f"run.root={tmp_path}", "engine.model=tiny-random"], None, quiet=True)
    assert cfg.engine.model == "tiny-random"  # an explicit model wins over the demo checkpoint


@pytest.mark.slow
def test_first_ask_searches_and_answers(tmp_path):
    """The acceptance check of a new user's first question (real SmolLM2, no trained run: the recipe)."""
    proc = subprocess.run([sys.executable, "-m", "hexsearch.cli", "ask", "In what year was the oldest city founded?",
                           f"run.root={tmp_path}"], capture_output=True, text=True, timeout=900)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "-> search(" in proc.stdout and "Answer:" in proc.stdout and "hexsearch view" in proc.stdout


def test_ask_checkpoint_flag_exports_once_and_answers_with_that_policy(tmp_path):
    from hexsearch.commands import ask

    run, _ = _trained_run(tmp_path, "train-pick", TrainConfig(precision="fp32"))
    cfg = ask._ask_config(None, [f"run.root={tmp_path / 'asks'}"], str(run), quiet=True)
    folder = run / "artifacts" / "hf-step-3"
    assert cfg.engine.model == str(folder) and (folder / "model.safetensors").exists()
    assert cfg.agent.temperature == 0 and cfg.run.root == str(tmp_path / "asks")
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    ask._ask_config(None, [], str(run / "checkpoints" / "step-3"), quiet=True)  # the step folder: same export
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
