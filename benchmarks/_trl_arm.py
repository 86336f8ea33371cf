"""The TRL arm of benchmarks/vs_trl.py: Hugging Face TRL's `GRPOTrainer` trains the quickstart task with its
own tool-calling loop (`tools=[search]`). Runs in .venv-trl (scripts/setup_trl.sh), never in the project's
.venv; vs_trl.py starts it and reads the JSON it writes.

What it shares with the hexsearch arm, so that the two differ only in the trainer:
- the model folder, the training questions, B questions x G samples, lr, AdamW, grad clip, T=1.0;
- the prompt: the same system prompt and worked example, the same ChatML rendering of the question, the
  tool result and the tags the harness writes (the "prefill": `<tool_call>\\n` opens the first assistant
  turn, `<answer>` the turn after the tool result). TRL has no prefill option; the chat template below
  writes them as part of the generation prompt, the one place TRL's tool loop lets text in;
- the search tool: every call goes to vs_trl.py's loopback server, which runs hexsearch's own search tool
  over the same index and returns the text the hexsearch agent would show (same top-k, same snippet);
- parsing and reward: hexsearch's Hermes parser (lenient, format gate) and F1 reward, imported from the
  checkout (`agent.formats`, `agent.rewards`: no third-party code beyond jsonschema);
- per-call token cap (32 new tokens) and one tool call per episode.

Wall clock counts from process start (imports, model load, setup included, like `train.time_budget_min`
for hexsearch); no new optimizer step starts once `--budget-s` is spent. Writes <out>/trl_arm.json and
the final model (plus the original tokenizer) to <out>/model for vs_trl.py's dev evaluation.
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
warnings.filterwarnings("ignore", category=FutureWarning)

# ChatML exactly as SmolLM2's template writes it (with a system message), plus: an assistant message with tool
# calls in Hermes form, a tool message as hexsearch's Hermes format renders it, and the harness's tags at the
# start of each generation prompt. Tools are not listed in the prompt (the system prompt describes the call),
# as in hexsearch, whose prompt is the same for SmolLM2 (its template has no tools block).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.tool_calls %}"
    "{%- for tc in message.tool_calls %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + (f.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- else %}{{- message.content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if messages[-1].role == 'tool' %}{{- '<answer>' }}{%- else %}{{- '<tool_call>\\n' }}{%- endif %}"
    "{%- endif %}"
)
FIRST_PREFILL, ANSWER_PREFILL = "<tool_call>\n", "<answer>"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--data", required=True, help="JSONL rows {question, golds, aug}")
    ap.add_argument("--agent", required=True, help="JSON of the hexsearch agent config (AgentConfig fields)")
    ap.add_argument("--tool-url", required=True, help="vs_trl.py's loopback search server")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--budget-s", type=float, required=True)
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--micro-batch", type=int, default=8, help="completions per forward/backward (0: B x G)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agent.config import AgentConfig
    from agent.formats import make_format
    from agent.rewards import episode_reward

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    agent_cfg = AgentConfig(**json.loads(Path(args.agent).read_text()))
    schema = _get(args.tool_url + "/schema")
    original_tok = AutoTokenizer.from_pretrained(args.model)
    fmt = make_format(agent_cfg, {"search": schema}, original_tok)  # hexsearch's parser, markers of SmolLM2's template
    eos = original_tok.eos_token

    tok = AutoTokenizer.from_pretrained(args.model)
    tok.chat_template = CHAT_TEMPLATE

    def parse_response(ids, prefix=None, tools=None):
        """TRL's hook for reading a turn: a tool call when hexsearch's parser finds one after the first-turn prefill."""
        text = tok.decode(ids, skip_special_tokens=False).removesuffix(eos)
        turn = fmt.parse(FIRST_PREFILL + text)
        if turn.ok and turn.calls:
            return {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": c.name, "arguments": dict(c.args)}} for c in turn.calls]}
        return {"role": "assistant", "content": text}

    tok.response_schema = {"parser": "hexsearch Hermes parser"}  # set: TRL keeps it and calls parse_response
    tok.parse_response = parse_response

    calls = {"n": 0, "s": 0.0}

    def search(query: str) -> str:
        """Search the encyclopedia.

        Args:
            query: Search query.
        """
        t = time.perf_counter()
        try:
            return _post(args.tool_url + "/search", {"query": query})["text"]
        finally:
            calls["n"] += 1
            calls["s"] += time.perf_counter() - t

    def answer_ends_turn(text: str) -> str:
        """hexsearch stops a turn at `</answer>`; TRL cannot stop generation at a string, so what follows
        the answer is cut here before parsing (it is still generated and trained on)."""
        end = text.find("</answer>")
        return text if end < 0 else text[:end + len("</answer>")]

    def episode(ids: list[int]) -> tuple[str | None, int]:
        """(prediction, format errors) of one completion, read the way the hexsearch agent reads its turns."""
        text = tok.decode(ids, skip_special_tokens=False)
        head, tool_open, tail = text.partition(fmt.markers.tool_open)
        if "</answer>" in head:   # answered in the first turn: the turn ended there
            head, tool_open = answer_ends_turn(head), ""
        first = fmt.parse(FIRST_PREFILL + head.removesuffix("\n").removesuffix(eos))
        if not first.ok:
            return None, 1
        if first.answer is not None:
            return first.answer, 0
        if not tool_open:  # a call, but no result came back (the completion budget was spent)
            return None, 0
        second = tail.rpartition(fmt.markers.tool_close + ANSWER_PREFILL)[2].removesuffix(eos)
        turn = fmt.parse(answer_ends_turn(ANSWER_PREFILL + second))
        if not turn.ok:
            return None, 1
        return turn.answer, 0

    def f1_reward(prompts, completions, completion_ids, golds, aug, **_):
        rewards = []
        for ids, g, a in zip(completion_ids, golds, aug, strict=True):
            pred, errors = episode(ids)
            r, _info = episode_reward(pred, g, a, metric="f1", aug_weight=agent_cfg.aug_answer_weight,
                                      format_errors=errors, format_gate=agent_cfg.format_gate, forced_valid=True,
                                      invalid_penalty=agent_cfg.invalid_penalty)
            rewards.append(r)
        return rewards

    system = fmt.system_prompt(True)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    data = Dataset.from_list([{"prompt": [{"role": "system", "content": system},
                                          {"role": "user", "content": fmt.user_prompt(r["question"])}],
                               "golds": r["golds"], "aug": r["aug"]} for r in rows])

    per_step = args.batch * args.group
    micro = args.micro_batch or per_step
    config = GRPOConfig(
        output_dir=str(out / "trainer"), use_cpu=True, bf16=True, seed=args.seed, data_seed=args.seed,
        per_device_train_batch_size=micro, gradient_accumulation_steps=per_step // micro,
        num_generations=args.group, max_steps=args.max_steps, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        temperature=agent_cfg.temperature, top_p=1.0, top_k=0,
        max_completion_length=256, generation_kwargs={"max_new_tokens": agent_cfg.max_new_tokens},
        max_tool_calling_iterations=agent_cfg.max_tool_calls,
        gradient_checkpointing=False,  # TRL's default (True) recomputes activations; memory is not short here
        logging_steps=1, save_strategy="no", report_to="none", remove_unused_columns=False,
        dataloader_num_workers=0, disable_tqdm=True)

    log: list[dict] = []
    generation = {"s": 0.0, "calls": 0}

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that times its rollouts (generation, tool calls, reward scoring) apart from training,
        for the report's generation/training split; TRL without this method reports no split."""

        if hasattr(GRPOTrainer, "_generate_and_score_completions"):
            def _generate_and_score_completions(self, *a, **kw):
                t = time.perf_counter()
                try:
                    return super()._generate_and_score_completions(*a, **kw)
                finally:
                    generation["s"] += time.perf_counter() - t
                    generation["calls"] += 1

    class Budget(TrainerCallback):
        """Same rule as hexsearch's `train.time_budget_min`: no new step once the budget is spent."""

        def on_step_end(self, a, state, control, **kw):
            log.append({"step": state.global_step, "t": time.time() - T0,
                        "generation_s": round(generation["s"], 3) if generation["calls"] else None})
            if time.time() - T0 >= args.budget_s:
                control.should_training_stop = True

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                log[-1:] and log[-1].update({k: logs[k] for k in ("reward", "reward_std", "tools/call_frequency")
                                             if k in logs})

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = TimedGRPOTrainer(model=model, reward_funcs=f1_reward, args=config, train_dataset=data,
                          processing_class=tok, tools=[search], callbacks=[Budget()])
    t_setup = time.time() - T0
    print(f"[trl] setup {t_setup:.1f}s, training (budget {args.budget_s:.0f}s from process start)", flush=True)
    trainer.train()
    t_train_end = log[-1]["t"] if log else time.time() - T0
    steps = log[-1]["step"] if log else 0
    trainer.model.save_pretrained(out / "model")
    original_tok.save_pretrained(out / "model")  # the model's own template: the dev evaluation renders as hexsearch does
    summary = {"steps": steps, "samples": steps * per_step, "train_s": t_train_end, "setup_s": t_setup,
               "samples_per_s": steps * per_step / t_train_end if t_train_end else 0.0,
               "tool_calls": calls["n"], "tool_s": round(calls["s"], 2), "log": log,
               "micro_batch": micro, "trl": __import__("trl").__version__}
    (out / "trl_arm.json").write_text(json.dumps(summary, indent=1))
    print(f"[trl] {steps} steps in {t_train_end:.1f}s: {summary['samples_per_s']:.3f} samples/s", flush=True)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


if __name__ == "__main__":
    main()
