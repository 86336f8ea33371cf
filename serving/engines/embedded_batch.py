"""The running batch of the embedded engine: admission, chunked prefill, decoding steps, compaction.
Each request in it is a `Seq` (serving/engines/embedded_seq.py).

Every method here runs on the engine's scheduler thread (never on the event loop). Row layout in the
SlotKVCache (one row per sequence, slot == position):

    rows [0, n_dec)                 decoding: one new token per row per step, all in one forward pass
    rows [wave_row0, +len(wave))    the admission wave: requests admitted together and not yet fully
                                    prefilled, sorted longest prompt first
    finished decoding row i         the last decoding row moves into i (a copy of its KV), so decoding
                                    rows stay contiguous and one view of the buffer serves the batch

Prefill takes the wave front by groups: a forward pass of at most ~`prefill_chunk_tokens` tokens covers
either several whole prompts or one slice of a long prompt. Rows whose prompt is complete join the
decoding rows at once (moved down over any gap left by finished rows), so the next decoding step
already includes them; one decoding step runs between two prefill chunks, so running requests keep
moving while long prompts are admitted.

A group is left-padded: the padding queries sit at slots *after* the row's real tokens (no real query
ever sees them; they are overwritten later), and every row's last real token is the chunk's last column,
so `logits_to_keep=1` yields the first-token logits of every row that completes its prompt.
"""

from __future__ import annotations

import inspect
import os
import time
from collections import deque
from collections.abc import Callable

import torch

from serving.engines import cpu_attention, cpu_llama
from serving.engines.embedded_seq import EmbeddedCompletion, Seq
from serving.engines.kv import PrefixCache, PrefixEntry, SlotKVCache
from serving.sampling import BatchParams, sample

STEM_MIN = 16
"""Fewest shared leading tokens worth a separate stem prefill (see `BatchRunner._prefill_stem`)."""


def fused_forward(model) -> tuple[cpu_llama.FusedLlama | None, str]:
    """The fused CPU forward for `model` when it applies (HEXSEARCH_FUSED_FORWARD=0 turns it off), and
    what the engine's forward passes use, in words."""
    if os.environ.get("HEXSEARCH_FUSED_FORWARD", "1") == "0":
        return None, "transformers (HEXSEARCH_FUSED_FORWARD=0)"
    why = cpu_llama.unsupported(model)
    if why is not None:
        return None, f"transformers ({why})"
    return cpu_llama.FusedLlama(model), "fused (serving/engines/cpu_llama.py)"


class BatchRunner:
    """Owns the model's forward passes, the KV slots and the per-row state (scheduler thread only)."""

    def __init__(self, model, tokenizer, *, max_batch_size: int, max_model_len: int, prefill_chunk_tokens: int,
                 kv_cache_bytes: int, prefix_cache_bytes: int, seed: int, version: int):
        cfg = model.config
        device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.model, self.tokenizer, self.device = model, tokenizer, device
        heads = cfg.num_attention_heads
        self.kv = SlotKVCache(cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or heads,
                              getattr(cfg, "head_dim", None) or cfg.hidden_size // heads, dtype, device)
        self.prefix = PrefixCache(prefix_cache_bytes)
        self.max_batch_size, self.max_model_len = max_batch_size, max_model_len
        self.prefill_chunk_tokens, self.kv_cache_bytes = prefill_chunk_tokens, kv_cache_bytes
        self.shared_gen = torch.Generator(device="cpu").manual_seed(seed)
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.native_attention = cpu_attention.install(model) if device.type == "cpu" else False
        self.fused, self.forward_status = fused_forward(model)
        self.version, self.epoch = version, 0
        self.rows: list[Seq | None] = []
        self.n_dec = 0
        self.wave: list[Seq] = []
        self.wave_row0 = 0
        self._params: BatchParams | None = None
        self.tokens_generated = 0
        self.prefill_tokens = 0
        self.stem_tokens_saved = 0
        self.rate_window: deque[tuple[float, int]] = deque()

    # ---- bookkeeping ---------------------------------------------------------------------------
    @property
    def n_running(self) -> int:
        return self.n_dec + sum(not s.done for s in self.wave)

    def running(self) -> list[Seq]:
        return [s for s in self.rows[: self.n_dec] if s is not None] + [s for s in self.wave if not s.done]

    def _set_row(self, row: int, seq: Seq | None) -> None:
        while len(self.rows) <= row:
            self.rows.append(None)
        self.rows[row] = seq
        if seq is not None:
            seq.row = row

    def can_start_wave(self) -> bool:
        return not self.wave and self.n_dec < self.max_batch_size

    def select_admissions(self, waiting: deque[Seq]) -> list[Seq]:
        """Pop the waiting requests that fit now: free rows, and the KV rectangle within budget.

        The rectangle (rows x longest projected length) bounds the memory the slot buffer can reach;
        a request that alone exceeds the budget is still admitted when nothing else runs.
        """
        if not self.can_start_wave():
            return []
        chosen: list[Seq] = []
        longest = max((s.projected_len for s in self.running()), default=0)
        per_token = self.kv.bytes_per_token
        while waiting and self.n_dec + len(chosen) < self.max_batch_size:
            seq = waiting[0]
            rows = self.n_dec + len(chosen) + 1
            if rows * max(longest, seq.projected_len) * per_token > self.kv_cache_bytes and rows > 1:
                break
            longest = max(longest, seq.projected_len)
            chosen.append(waiting.popleft())
        return chosen

    def start_wave(self, seqs: list[Seq]) -> None:
        """Reuse cached prefixes, share identical prompts, and give the wave rows after the decoding rows.

        Requests with the same prompt (GRPO groups, `n` > 1) are prefilled once: the first is the
        leader, the others follow at the wave's tail and get a copy of the leader's KV row when its
        prompt completes, then sample their own first token from the leader's logits.
        """
        seqs = [s for s in seqs if not s.done]  # cancelled between selection and start
        if not seqs:
            return
        reuse: dict[int, tuple] = {}
        leaders: dict[tuple[int, ...], Seq] = {}
        for seq in seqs:
            seq.epoch = self.epoch
            reuse[id(seq)] = self.prefix.take_match(seq.request.request_id, seq.prompt)
            if reuse[id(seq)][1] is None:
                reuse[id(seq)] = self.prefix.longest_shared(seq.prompt)
        self._prefill_stem(seqs, reuse)
        for seq in sorted(seqs, key=lambda s: -reuse[id(s)][0]):  # the longest reused prefix leads
            lead = leaders.setdefault(tuple(seq.prompt), seq)
            if lead is not seq:
                seq.leader = lead
                lead.followers.append(seq)
        heads = sorted(leaders.values(), key=lambda s: len(s.prompt) - reuse[id(s)][0], reverse=True)
        ordered = heads + [f for lead in heads for f in lead.followers]
        self.wave_row0 = self.n_dec
        self.kv.ensure(self.n_dec + len(ordered), max(len(s.prompt) for s in seqs) + 1,
                       max(s.projected_len for s in seqs))
        for i, seq in enumerate(ordered):
            self._set_row(self.wave_row0 + i, seq)
            n, entry = reuse[id(seq)] if seq.leader is None else (0, None)
            if entry is not None:
                self.kv.write_row(seq.row, entry.kv[:, :, :, :n])
            seq.kv_len = n
        self.wave = ordered

    def _prefill_stem(self, seqs: list[Seq], reuse: dict[int, tuple]) -> None:
        """Prefill once the prefix several different prompts of this wave share (the system prompt and
        worked examples of a batch of episodes) and let each of them copy it.

        Right after a weight update the prefix cache is empty, so without this every question of the
        wave would prefill the same few hundred system-prompt tokens again. The stem is kept in the
        prefix cache like a finished request, so later waves of the same version reuse it too. Only
        the largest bucket of prompts with the same first `STEM_MIN` tokens counts, and the stem stops
        one token short of its shortest prompt (whose last token must give first-token logits).
        """
        fresh = {tuple(s.prompt): s.prompt for s in seqs if reuse[id(s)][0] < STEM_MIN}
        buckets: dict[tuple[int, ...], list[list[int]]] = {}
        for prompt in fresh.values():
            if len(prompt) > STEM_MIN:
                buckets.setdefault(tuple(prompt[:STEM_MIN]), []).append(prompt)
        group = max(buckets.values(), key=len, default=[])
        if len(group) < 2:
            return
        first = group[0]
        n = min(len(os.path.commonprefix(group)), min(len(p) for p in group) - 1)  # works on any sequences
        row = self.n_dec + len(seqs)  # a scratch row past the wave's rows
        self.kv.ensure(row + 1, n + 1, n + 1)
        for start in range(0, n, self.prefill_chunk_tokens):
            stop = min(n, start + self.prefill_chunk_tokens)
            ids = torch.tensor([first[start:stop]], dtype=torch.long, device=self.device)
            self._forward(ids, torch.arange(start, stop, device=self.device)[None, :], row)
        entry = PrefixEntry(first[:n], self.kv.read_row(row, n))
        self.prefill_tokens += n
        self.stem_tokens_saved += n * (len(group) - 1)
        if self.prefix.max_bytes > 0:
            self.prefix.put(f"__stem__/{self.epoch}/{hash(tuple(entry.token_ids))}", entry)
        for seq in seqs:
            if reuse[id(seq)][0] < n and seq.prompt[:n] == entry.token_ids:
                reuse[id(seq)] = (n, entry)

    # ---- forward passes ------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, row0: int, decoding: bool = False) -> torch.Tensor:
        """One forward pass of rows [row0, row0+len(ids)) at positions `pos`; the last column's logits.

        A decoding step (one token per row, each row's slots 0..pos filled) also passes the rows' lengths,
        which the native CPU decode attention (serving/engines/cpu_attention.py) uses when it is installed.
        """
        length = int(pos.max()) + 1
        hint = max((s.projected_len for s in self.running()), default=0) + self.prefill_chunk_tokens
        self.kv.ensure(row0 + ids.shape[0], length, hint)
        if self.fused is not None:
            return self.fused.forward(ids, pos, self.kv, row0, pos[:, 0] + 1 if decoding else None, self.epoch)
        self.kv.bind(row0, ids.shape[0], pos, length)
        mask = torch.arange(length, device=self.device)[None, None, None, :] <= pos[:, None, :, None]
        extra = {"hex_decode_lengths": pos[:, 0] + 1} if decoding and self.native_attention else {}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **{self.cache_kw: self.kv}, **extra)
        return out.logits[:, -1].float()

    @property
    def n_prefill(self) -> int:
        """Sequences admitted and not yet fully prefilled."""
        return len(self.wave)

    def prefill_chunk(self) -> None:
        """Prefill the next group of wave leaders; rows that complete their prompt (and their followers)
        sample their first token (finishing at once on e.g. EOS) and join the decoding rows."""
        front = self.wave[0]
        width = min(len(front.prompt) - front.kv_len, self.prefill_chunk_tokens)
        group = [s for s in self.wave[: max(1, self.prefill_chunk_tokens // width)] if s.leader is None]
        remaining = [len(s.prompt) - s.kv_len for s in group]  # <= width except for a sliced front prompt
        ids = torch.zeros((len(group), width), dtype=torch.long)
        pos = torch.empty((len(group), width), dtype=torch.long)
        for i, (seq, rem) in enumerate(zip(group, remaining, strict=True)):
            n = min(width, rem)
            pad = width - n
            ids[i, pad:] = torch.tensor(seq.prompt[seq.kv_len: seq.kv_len + n])
            pos[i, pad:] = torch.arange(seq.kv_len, seq.kv_len + n)
            pos[i, :pad] = torch.arange(seq.kv_len + n, seq.kv_len + width)  # padding: slots after the data
            seq.kv_len += n
            self.prefill_tokens += n
        logits = self._forward(ids.to(self.device), pos.to(self.device), self.wave_row0)
        rows, seqs = [], []
        for i, rem in enumerate(remaining):
            if rem > width:
                continue  # a sliced long prompt: more chunks to go
            for seq in (group[i], *group[i].followers):
                if seq is not group[i]:
                    self.kv.move_row(group[i].row, seq.row, group[i].kv_len)  # copy the shared prompt's KV
                    seq.kv_len = group[i].kv_len
                if not seq.done:
                    rows.append(i)
                    seqs.append(seq)
        finished = []
        if seqs:
            params = BatchParams.build(*self._param_lists(seqs))
            finished = self._accept(sample(logits[rows], params, self.shared_gen), seqs)
        self.finish(finished)  # while their rows still hold their KV (kept for sticky request ids)
        self._join_decoding()

    def _join_decoding(self) -> None:
        """Move the prefilled front of the wave right after the decoding rows (dropping finished ones)."""
        def ready(seq: Seq) -> bool:  # prefilled, or finished and nobody needs its KV any more
            if seq.kv_len >= len(seq.prompt):
                return True
            return seq.done and (seq.leader is not None or all(f.done for f in seq.followers))

        k = 0
        while k < len(self.wave) and ready(self.wave[k]):
            k += 1
        for seq in self.wave[:k]:
            if self.rows[seq.row] is seq:
                self.rows[seq.row] = None
            if not seq.done:
                self.kv.move_row(seq.row, self.n_dec, seq.kv_len)
                self._set_row(self.n_dec, seq)
                self.n_dec += 1
        if k:
            self.wave = self.wave[k:]
            self.wave_row0 += k
            self._params = None
        if all(s.done for s in self.wave):  # aborted while waiting for prefill: drop the rest
            for seq in self.wave:
                if self.rows[seq.row] is seq:
                    self.rows[seq.row] = None
            self.wave = []

    def decode_step(self) -> list[Seq]:
        """One token for every decoding row; returns the sequences that finished."""
        seqs: list[Seq] = self.rows[: self.n_dec]  # type: ignore[assignment]
        ids = torch.tensor([[s.tokens[-1]] for s in seqs], dtype=torch.long, device=self.device)
        pos = torch.tensor([[s.kv_len] for s in seqs], dtype=torch.long, device=self.device)
        logits = self._forward(ids, pos, 0, decoding=True)
        for s in seqs:
            s.kv_len += 1
        if self._params is None:
            self._params = BatchParams.build(*self._param_lists(seqs))
        return self._accept(sample(logits, self._params, self.shared_gen), seqs)

    @staticmethod
    def _param_lists(seqs: list[Seq]):
        sp = [s.request.sampling for s in seqs]
        return ([p.temperature for p in sp], [p.top_p for p in sp], [max(p.top_k, 0) for p in sp],
                [s.generator for s in seqs], max(s.top_logprobs for s in seqs))

    def _accept(self, step, seqs: list[Seq]) -> list[Seq]:
        """Append each row's sampled token; return the sequences that are now finished."""
        finished = []
        for i, seq in enumerate(seqs):
            token = step.tokens[i]
            seq.tokens.append(token)
            seq.logprobs.append(step.logprobs[i])
            seq.versions.append(self.version)
            if seq.top_logprobs:
                seq.top.append(step.top[i][: seq.top_logprobs])
            if self._finish_reason(seq, token) is not None and not seq.done:
                finished.append(seq)
        self._count(len(seqs))
        return finished

    def _finish_reason(self, seq: Seq, token: int):
        if token in seq.stop_ids:
            seq.finish = ("stop", token)
        elif seq.stops and (hit := self._stop_hit(seq)) is not None:
            seq.finish = ("stop", hit)
        elif seq.n_out >= seq.max_new:
            seq.finish = ("length", None)
        else:
            return None
        return seq.finish

    def _stop_hit(self, seq: Seq) -> str | None:
        start = max(len(seq.prompt), len(seq.tokens) - seq.stop_window)
        tail = self.tokenizer.decode(seq.tokens[start:], skip_special_tokens=False)
        return next((s for s in seq.stops if s in tail), None)

    def _count(self, n: int) -> None:
        now = time.monotonic()
        self.tokens_generated += n
        self.rate_window.append((now, n))
        while self.rate_window and now - self.rate_window[0][0] > 10.0:
            self.rate_window.popleft()

    def tokens_per_s(self) -> float:
        if len(self.rate_window) < 2:
            return 0.0
        span = self.rate_window[-1][0] - self.rate_window[0][0]
        return sum(n for _, n in list(self.rate_window)[1:]) / span if span > 0 else 0.0

    # ---- finishing -----------------------------------------------------------------------------
    def finish(self, seqs: list[Seq], reason: str | None = None) -> None:
        """Deliver results, keep reusable KV, and free the rows (compacting the decoding rows)."""
        dec_rows = []
        for seq in seqs:
            if seq.done:
                continue
            seq.done = True
            finish_reason, stop_reason = (reason, None) if reason else seq.finish
            if seq.row >= 0 and seq.kv_len > 0 and seq.epoch == self.epoch and self.prefix.max_bytes > 0:
                kv_len = min(seq.kv_len, len(seq.tokens))
                self.prefix.put(seq.request.request_id,
                                PrefixEntry(seq.tokens[:kv_len], self.kv.read_row(seq.row, kv_len)))
            seq.deliver(EmbeddedCompletion(
                seq.tokens[len(seq.prompt):], seq.logprobs, seq.versions, finish_reason, stop_reason,
                top_logprobs=seq.top if seq.top_logprobs else None, prompt_ids=seq.prompt))
            if 0 <= seq.row < self.n_dec and self.rows[seq.row] is seq:
                dec_rows.append(seq.row)
        for row in sorted(dec_rows, reverse=True):
            last = self.n_dec - 1
            if row != last:
                moved = self.rows[last]
                self.kv.move_row(last, row, moved.kv_len)
                self._set_row(row, moved)
            self.rows[last] = None
            self.n_dec -= 1
        if dec_rows:
            self._params = None

    def release_if_idle(self) -> None:
        """Free the KV buffer when nothing runs, so one long burst does not pin its memory."""
        if not self.n_dec and not self.wave and self.kv.kv is not None:
            self.kv.release()
            self.rows = []

    def reset(self) -> None:
        """Forget every row (after a failed forward pass; the requests were already failed)."""
        for seq in self.running():
            seq.done = True
        self.rows, self.n_dec, self.wave, self._params = [], 0, [], None
        self.kv.release()

    def abort(self, predicate: Callable[[Seq], bool]) -> int:
        """Finish matching running sequences now with finish_reason `abort` (partial tokens kept)."""
        hit = [s for s in self.running() if predicate(s)]
        self.finish(hit, "abort")
        self._join_decoding()
        self.release_if_idle()
        return len(hit)
