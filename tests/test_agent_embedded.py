"""Behaviour log-probs recorded by an episode on the real embedded engine equal a teacher-forced pass.

The episode runs several calls on one request id (so the engine reuses the KV cache of earlier
calls and prefills only the appended tool text); the check runs the recorded segment through the
same weights in one forward pass and compares every policy token's log-prob (fp32, < 1e-3).
"""

from __future__ import annotations

import torch

from agent.config import AgentConfig
from agent.loop import run_episode
from agent.qa import QAItem
from tools.memory import MemorySearch

DOCS = [{"title": f"Town {i}", "url": f"https://hexwiki.test/wiki/T{i}",
         "contents": f"Town {i} lies in the province of Qesmir. It was founded in {1600 + i}."} for i in range(20)]


def teacher_forced_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 (entry t-1), from one forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return logp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)


async def _check_episode(spec: str, cfg: AgentConfig, min_generated: int) -> None:
    from serving.engines.embedded import EmbeddedEngine
    from serving.models import load_model

    engine = EmbeddedEngine(spec, dtype="float32", device="cpu", max_batch_size=4)
    try:
        item = QAItem("t3", "In what year was Town 3 founded?", ["1603"])
        traj = await run_episode(item, engine, {"search": MemorySearch(DOCS, topk=2)}, cfg, seed=11)
    finally:
        await engine.aclose()
    assert traj.num_turns >= 2 and traj.num_generated >= min_generated, traj.stop_reason
    assert len(traj.tool_calls) >= 1  # tool text sits between the calls of the segment
    model = load_model(spec, dtype="float32", device="cpu")
    worst = 0.0
    for seg in traj.segments:
        ref = teacher_forced_logprobs(model, seg.token_ids)
        for t, (m, lp) in enumerate(zip(seg.loss_mask, seg.logprobs, strict=True)):
            if m:
                assert t > 0
                worst = max(worst, abs(lp - ref[t - 1].item()))
    assert worst < 1e-3, worst


async def test_embedded_logprobs_match_teacher_forcing_tiny():
    # the CPU recipe makes even a random model act: prefilled <search> and <answer>, lenient closing
    cfg = AgentConfig(prefill="tags", lenient_tags=True, read_search_results=True, max_tool_calls=1,
                      max_new_tokens=12, max_turns=4, temperature=1.0)
    await _check_episode("tiny-random", cfg, min_generated=20)


async def test_embedded_logprobs_match_teacher_forcing_smollm2():
    cfg = AgentConfig(prefill="tags", lenient_tags=True, worked_example=True, read_search_results=False,
                      max_tool_calls=1, max_new_tokens=24, max_turns=3, temperature=1.0)
    await _check_episode("smollm2-135m-instruct", cfg, min_generated=4)
