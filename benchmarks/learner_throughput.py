"""The learner's trained tokens/s on long agent sequences, its share of this CPU's matmul peak (MFU), and a
plain PyTorch/transformers training step on the same sequences as the baseline.

Workload. Token sequences shaped like the long-horizon recipe's episodes, --lengths tokens each (drawn
uniformly, seeded): one system prompt shared by every sequence (--system-tokens), a question shared by the
--group samples of a question, then turns of a policy segment (a tool call, 16-40 tokens, loss_mask=1) and a
tool result (120-260 tokens, loss_mask=0), ending with a policy answer: about 13% of the tokens carry loss.
Token ids are random (compute does not depend on them). Advantages +-1, behaviour log-probs -1.

Arms, same sequences, same dtype, same torch threads (default: the config's learner threads):

    ours      trainer.learner.Learner(cfg.train, smollm2-135m-instruct).train_step(samples, 0): the config's
              packing, prefix sharing and precision (`auto`: bf16 autocast on fast-bf16 CPUs), PPO loss,
              grad clip, fused AdamW
    baseline  the HF model (fp32 weights, SDPA attention, the same autocast) per sequence with labels = the
              policy tokens (-100 elsewhere) and num_items_in_batch = the batch's policy tokens (the same
              token-mean), backward, the same grad clip, torch.optim.AdamW with its defaults

    tokens_per_s = tokens of all sequences / wall seconds of one whole step       ratio = ours / baseline

FLOPs (counted for what each arm computes; matmuls only, embeddings and norms left out):

    dense     6 x P_dense per computed token         P_dense = weights of the decoder layers' linear layers
    attention 12 x L x d_model x ctx per computed query, ctx = its position + 1 (the keys a causal query
              attends to: QK^T and AV are 2 x d_model x ctx FLOPs each forward, x3 with backward). Summed
              over positions this is 12 x L x d_model x ~seq/2 per token: the usual 12 x L x seq x d_model
              counts the masked half of the causal square too, which a causal kernel does not compute
    lm_head   6 x d_model x vocab per position whose logits are computed: ours only at the positions that
              predict a policy token (the learner gathers them); the baseline at every position

    A token the learner does not compute does not count: the step-wide system-prompt stem runs once
    (learner.stem_tokens says how many tokens it saved) and a prefix shared inside a micro-batch runs once.
    Padding is computed but not counted (it is waste).

Peak. Each repeat times torch matmuls of the learner's shapes (every linear layer's forward, input-gradient
and weight-gradient GEMM at the micro-batch's token count, and the lm_head at the policy positions) in the
learner's compute dtype at the same thread count; peak_gflops = the fastest. mfu = counted FLOPs / step
seconds / peak, per repeat (each against its own repeat's peak, so contention hits both alike).

Repeats (--repeats, at least 3) alternate which arm runs first, after one untimed warm-up step per arm (the
first step allocates the AdamW moments). Figures are the median over repeats with the range. The machine may be
shared: the figures are wall-clock.

    python benchmarks/learner_throughput.py [--quick] [--repeats 3] [--config configs/quickstart.yaml]
        [--threads N] [--profile] [key=value config overrides, e.g. train.packing=concat]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RECORDS, fmt, kv, spread, write_result  # noqa: E402

MODEL = "smollm2-135m-instruct"


# ---- the workload --------------------------------------------------------------------------------
def agent_sequences(vocab: int, questions: int, group: int, lengths: tuple[int, int], system_tokens: int,
                    seed: int = 0) -> list:
    """`questions` x `group` Samples shaped like long-horizon episodes (see the module docstring)."""
    from trainer.packing import Sample

    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    system = tokens(system_tokens)
    out = []
    for q in range(questions):
        question = tokens(40)
        for g in range(group):
            target = rng.randint(*lengths)
            ids, mask = system + question, [0] * (system_tokens + 40)
            while len(ids) < target - 12:
                call, tool = rng.randint(16, 40), rng.randint(120, 260)
                ids += tokens(call) + tokens(tool)
                mask += [1] * call + [0] * tool
            ids, mask = ids[:target - 12] + tokens(12), mask[:target - 12] + [1] * 12  # the answer
            n = len(ids)
            out.append(Sample(ids, mask, [-1.0] * n, [0] * n, advantage=1.0 if (q + g) % 2 else -1.0))
    return out


# ---- FLOPs ---------------------------------------------------------------------------------------
def model_dims(model) -> dict:
    """d_model, layers, vocab and the dense (decoder linear layer) weight count of a HF causal LM."""
    import torch

    head = model.get_output_embeddings()
    linears = [m for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear) and m is not head]
    shapes = sorted({(m.in_features, m.out_features) for m in linears})
    return {"d_model": model.config.hidden_size, "layers": model.config.num_hidden_layers,
            "vocab": head.out_features, "dense_params": sum(m.weight.numel() for m in linears),
            "linear_shapes": shapes}


def _ctx_sum(a: int, b: int) -> int:
    """Sum of (p + 1) for positions p in [a, b): the keys the causal queries a..b-1 attend to."""
    return (b * (b + 1) - a * (a + 1)) // 2 if b > a else 0


def flops(dims: dict, spans: list[tuple[int, int]], head_positions: int) -> float:
    """FLOPs of forward+backward over the computed position spans [a, b) plus the lm_head positions."""
    tokens = sum(b - a for a, b in spans)
    attn = 12 * dims["layers"] * dims["d_model"] * sum(_ctx_sum(a, b) for a, b in spans)
    return 6.0 * dims["dense_params"] * tokens + attn + 6.0 * dims["d_model"] * dims["vocab"] * head_positions


def ours_spans(learner, samples: list, stem_length: int) -> list[tuple[int, int]]:
    """The position spans the learner's step computes: the stem once, a micro-batch's shared prefix once,
    each row from there on (trainer/learner.py `_stem`, `_hidden`)."""
    from trainer.packing import collate
    from trainer.prefix_sharing import shared_prefix

    plan = learner._plan(samples)
    spans = [(0, stem_length)] if stem_length else []
    for idx in plan:
        mb = collate(samples, idx, learner.cfg.packing, 0)
        if mb.attention_mask is None:  # concat: one row, position ids restart per sequence
            spans += [(0, len(samples[i])) for i in idx]
            continue
        start = stem_length
        shared = shared_prefix(mb.input_ids, mb.attention_mask) if learner.share_prefix else 0
        if shared - start >= 16:
            spans.append((start, shared))
            start = shared
        spans += [(start, len(samples[i])) for i in idx]
    return spans


# ---- the peak ------------------------------------------------------------------------------------
def matmul_peak(dims: dict, rows: int, policy_rows: int, dtype, reps: int = 3) -> dict:
    """GFLOP/s of the learner's GEMMs (forward, input grad, weight grad of every linear shape at `rows` tokens;
    the lm_head at `policy_rows`), best of `reps` timings each; `peak` is the fastest."""
    import torch

    shapes = []
    for k, n in [*dims["linear_shapes"], (dims["d_model"], dims["vocab"])]:
        m = policy_rows if n == dims["vocab"] else rows
        shapes += [(m, k, n), (m, n, k), (n, m, k)]  # y = xW^T, dx = dy W, dW = dy^T x
    out = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        a @ b
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
        out[f"{m}x{k}x{n}"] = round(2 * m * k * n / best / 1e9, 1)
    return {"peak": max(out.values()), "shapes": out}


# ---- the baseline --------------------------------------------------------------------------------
class Baseline:
    """A plain transformers training step (see the module docstring)."""

    def __init__(self, cfg, autocast):
        import torch

        from serving.models import load_model

        self.model = load_model(MODEL, dtype="float32", attn_implementation="sdpa").train()
        self.cfg, self.autocast = cfg, autocast
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas),
                                     weight_decay=cfg.weight_decay)

    def step(self, samples: list) -> float:
        """One step over all samples; returns the loss (token-mean NLL of the policy tokens)."""
        import contextlib

        import torch

        total = sum(s.num_loss_tokens for s in samples)
        self.opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for s in samples:
            ids = torch.tensor([s.token_ids])
            labels = ids.masked_fill(torch.tensor([s.loss_mask]) == 0, -100)
            ctx = torch.autocast("cpu", dtype=self.autocast) if self.autocast else contextlib.nullcontext()
            with ctx:
                loss = self.model(input_ids=ids, labels=labels, num_items_in_batch=total).loss
            loss.backward()
            loss_sum += float(loss.detach())
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()
        return loss_sum


def profile_ours(learner, samples: list) -> None:
    """Where one step of the learner spends its time (torch.profiler, top ops by self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        learner.train_step(samples, 0)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/quickstart.yaml", help="the learner's settings (train section)")
    ap.add_argument("--quick", action="store_true", help="1 question x 2 samples of 900-1300 tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--group", type=int, default=2, help="samples per question")
    ap.add_argument("--lengths", default="1000-2600", help="sequence lengths, lo-hi tokens")
    ap.add_argument("--system-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the config's learner threads)")
    ap.add_argument("--profile", action="store_true", help="print a torch.profiler table of one step of ours")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/learner_throughput.json)")
    ap.add_argument("--no-record", action="store_true", help="leave benchmarks/records.jsonl alone (trial runs)")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = ap.parse_args()
    if args.repeats < 3:
        ap.error("--repeats must be at least 3 (a median with its range)")
    if args.quick:
        args.questions, args.group, args.lengths = 1, 2, "900-1300"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from core.hardware import cpu_has_fast_bf16
    from hexsearch.config import load_config
    from trainer.learner import Learner

    cfg = load_config(args.config, args.overrides).train
    threads = args.threads or cfg.learner_resources.threads or max(1, int(cfg.learner_resources.num_cpus))
    torch.set_num_threads(threads)
    learner = Learner(cfg, MODEL)
    dtype = learner.autocast or torch.float32
    fast_bf16 = cpu_has_fast_bf16()
    lo, hi = (int(x) for x in args.lengths.split("-"))
    samples = agent_sequences(len(learner.tokenizer), args.questions, args.group, (lo, hi), args.system_tokens)
    baseline = Baseline(cfg, learner.autocast)
    dims = model_dims(learner.base)
    tokens = sum(len(s) for s in samples)
    policy = sum(s.num_loss_tokens for s in samples)
    print(f"{len(samples)} sequences, {tokens} tokens ({[len(s) for s in samples]}), {policy} policy tokens; "
          f"dtype={str(dtype).replace('torch.', '')} (fast bf16: {fast_bf16}), threads={threads}, "
          f"packing={cfg.packing}, share_prefix={learner.share_prefix}", flush=True)

    stem0 = learner.stem_tokens
    warm = learner.train_step(samples, 0)
    plan = learner._plan(samples)
    stem_length = (learner.stem_tokens - stem0) // max(1, len(plan) - 1)
    base_nll = baseline.step(samples)
    print(f"warm-up: nll ours={warm['train/nll']:.4f} baseline={base_nll:.4f} (same weights: should agree)",
          flush=True)
    ours_flops = flops(dims, ours_spans(learner, samples, stem_length), policy)
    base_flops = flops(dims, [(0, len(s)) for s in samples], sum(len(s) for s in samples))
    if args.profile:
        profile_ours(learner, samples)

    rows = max(len(s) for s in samples)
    rounds = []
    for r in range(args.repeats):
        peak = matmul_peak(dims, rows, max(1, policy // len(samples)), dtype)
        result = {"peak_gflops": peak["peak"], "peak_shapes": peak["shapes"]}
        for arm in (["ours", "baseline"] if r % 2 == 0 else ["baseline", "ours"]):
            t = time.perf_counter()
            learner.train_step(samples, r + 1) if arm == "ours" else baseline.step(samples)
            result[f"{arm}_s"] = time.perf_counter() - t
        result["ours_tok_s"] = tokens / result["ours_s"]
        result["baseline_tok_s"] = tokens / result["baseline_s"]
        result["mfu"] = ours_flops / result["ours_s"] / (peak["peak"] * 1e9)
        result["baseline_mfu"] = base_flops / result["baseline_s"] / (peak["peak"] * 1e9)
        print(f"repeat {r + 1}/{args.repeats}: ours {result['ours_tok_s']:.1f} tok/s (mfu {result['mfu']:.3f}), "
              f"baseline {result['baseline_tok_s']:.1f} tok/s (mfu {result['baseline_mfu']:.3f}), "
              f"peak {peak['peak']:.1f} GFLOP/s", flush=True)
        rounds.append(result)

    def per(key: str) -> dict:
        return spread([x[key] for x in rounds])

    mfu, tok, base_tok, peak_s = per("mfu"), per("ours_tok_s"), per("baseline_tok_s"), per("peak_gflops")
    ratio = spread([x["ours_tok_s"] / x["baseline_tok_s"] for x in rounds])
    base_mfu = per("baseline_mfu")
    dname = str(dtype).replace("torch.", "")
    line = (f"RESULT learner_throughput {kv('mfu', mfu, 3)} {kv('tokens_per_s', tok, 1)} "
            f"{kv('peak_gflops', peak_s, 1)} {kv('ratio', ratio)} {kv('baseline_tokens_per_s', base_tok, 1)} "
            f"{kv('baseline_mfu', base_mfu, 3)} repeats={len(rounds)} sequences={len(samples)} tokens={tokens} "
            f"policy_tokens={policy} dtype={dname} threads={threads} packing={cfg.packing} "
            f"quick={int(args.quick)}")
    headline = {"mfu": mfu, "tokens_per_s": tok, "peak_gflops": peak_s, "ratio": ratio,
                "baseline_tokens_per_s": base_tok, "baseline_mfu": base_mfu}
    details = {"model": MODEL, "config": {**vars(args), "train": {k: str(v) for k, v in vars(cfg).items()}},
               "dims": {k: v for k, v in dims.items() if k != "linear_shapes"}, "stem_length": stem_length,
               "flops_per_step": {"ours": ours_flops, "baseline": base_flops},
               "lengths": [len(s) for s in samples], "warmup_nll": {"ours": warm["train/nll"], "baseline": base_nll},
               "rounds": rounds}
    path = write_result("learner_throughput", line, headline, details, out=args.out,
                        records=None if args.no_record else RECORDS)
    print(f"ours {fmt(tok, 1)} tok/s, baseline {fmt(base_tok, 1)} tok/s, mfu {fmt(mfu, 3)}; wrote {path}")
    print(line)


if __name__ == "__main__":
    main()
