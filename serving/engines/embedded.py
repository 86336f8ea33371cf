"""The embedded inference engine: transformers in this process, continuous batching on CPU or one GPU.

    engine = EmbeddedEngine("smollm2-135m-instruct")          # or a loaded model (+ tokenizer), or a PeftModel
    done = await engine.generate(GenerateRequest(prompt_ids, SamplingParams(max_new_tokens=64)))
    await engine.pause("abort"); await engine.update_weights(state_dict, version=1); await engine.resume()

`generate` is an asyncio front; one scheduler thread runs every forward pass (torch releases the GIL,
so the event loop stays responsive). The thread loops: take commands (abort, barriers) -> admit waiting
requests as a prefill wave -> one prefill chunk -> one decoding step for all running rows -> deliver
finished results. See `serving.engines.embedded_batch` for the batch layout and `serving.engines.kv` for the KV slots.

Behaviour log-probs are log_softmax of the raw logits (temperature 1, no top-k/top-p), so they equal a
teacher-forced forward pass of the same weights (see `serving.sampling`). Each token records the weight
version it was sampled under.

Pausing: `abort` finishes in-flight requests now (finish_reason "abort", partial tokens kept); `wait`
stops admitting and returns when in-flight requests are done; `keep` freezes in-flight requests where
they are (they continue on resume; tokens sampled after a weight update carry the new version).
Requests that arrive while paused wait for `resume()`. `update_weights` is safe at any time (it runs
between two steps) but is meant to be called while paused; it invalidates every cached prefix.

Sticky request ids: when a request finishes, its KV is kept (LRU, `prefix_cache_gb`) under its
request_id; the next request with that id whose prompt extends those tokens prefills only the suffix.

The engine owns the model object it is given: weights change only through `update_weights`. A peft
model is copied and merged (the trainer keeps its own); a plain model is used as is, so pass a copy if
you keep training the original.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections import deque
from pathlib import Path
from typing import Any

import torch

from serving.engines import cpu_attention
from serving.engines.embedded_batch import BatchRunner
from serving.engines.embedded_seq import EmbeddedCompletion, Seq
from serving.engines.embedded_weights import LoraState, apply_update, capture_peft, read_folder
from serving.protocol import Completion, GenerateRequest, is_checkpoint_dir

PAUSE_MODES = ("abort", "wait", "keep")


def _resolve(fut: asyncio.Future, result) -> None:
    if not fut.done():
        fut.set_exception(result) if isinstance(result, BaseException) else fut.set_result(result)


def _deliverer(loop: asyncio.AbstractEventLoop, fut: asyncio.Future):
    def deliver(result) -> None:
        try:
            loop.call_soon_threadsafe(_resolve, fut, result)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
            pass
    return deliver


class EmbeddedEngine:
    """InferenceEngine over a transformers causal LM (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any = None, *, dtype: str = "auto", device: str = "auto",
                 max_batch_size: int = 64, max_model_len: int = 4096, prefill_chunk_tokens: int = 1024,
                 kv_cache_gb: float = 2.0, prefix_cache_gb: float = 1.0, threads: int = 0, seed: int = 0,
                 version: int = 0, name: str | None = None):
        from serving.models import load_model, load_tokenizer, torch_dtype

        if threads > 0:
            torch.set_num_threads(threads)
        device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.lora = LoraState()
        if isinstance(model, (str, Path)):
            name = name or str(model)
            tokenizer = tokenizer or load_tokenizer(str(model))
            model = load_model(str(model), dtype=dtype, device=device)
        else:
            if hasattr(model, "peft_config"):
                model, self.lora = capture_peft(model)
            model = model.to(device=device, dtype=torch_dtype(dtype, device)).eval()
            name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        if tokenizer is None:
            raise ValueError("a tokenizer is required when the engine is given a loaded model")
        self._check_supported(model)
        self.model, self._tokenizer, self.name = model, tokenizer, name
        self.max_model_len = min(max_model_len, getattr(model.config, "max_position_embeddings", max_model_len))
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else {gen_eos}
        self.eos_ids = frozenset(int(e) for e in eos if e is not None)
        # the scheduler thread decodes stop-string tails with its own copy: a fast tokenizer used from two
        # threads at once (the server encodes prompts meanwhile) can fail with "Already borrowed"
        self._runner = BatchRunner(
            model, copy.deepcopy(tokenizer), max_batch_size=max_batch_size, max_model_len=self.max_model_len,
            prefill_chunk_tokens=prefill_chunk_tokens, kv_cache_bytes=int(kv_cache_gb * 2**30),
            prefix_cache_bytes=int(prefix_cache_gb * 2**30), seed=seed, version=version)
        self._cv = threading.Condition()
        self._model_lock = threading.Lock()
        self._waiting: deque[Seq] = deque()
        self._commands: list[tuple] = []
        self._paused: str | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="hexsearch-embedded-engine", daemon=True)
        self._thread.start()

    @staticmethod
    def _check_supported(model) -> None:
        layer_types = getattr(model.config, "layer_types", None) or []
        if any("sliding" in str(t) for t in layer_types):
            raise ValueError(f"{type(model).__name__} uses sliding-window attention layers, which the embedded "
                             "engine's full-attention KV slots do not implement")

    # ---- protocol properties ---------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._runner.version

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    # ---- generate --------------------------------------------------------------------------------
    def _make_seq(self, request: GenerateRequest, deliver, top_logprobs: int) -> Seq:
        """Validate a request (ValueError with the reason) and turn it into a waiting sequence."""
        p = request.sampling
        prompt = [int(t) for t in request.prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token id(s) {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt has {len(prompt)} tokens; max_model_len is {self.max_model_len} "
                             "(prompt + output must fit)")
        if p.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {p.max_new_tokens}")
        if p.temperature < 0 or not 0 < p.top_p <= 1:
            raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {p.temperature}, {p.top_p}")
        if any(not isinstance(s, str) or not s for s in p.stop):
            raise ValueError("stop strings must be non-empty strings")
        generator = None
        if p.seed is not None:
            generator = torch.Generator(device="cpu").manual_seed(int(p.seed))
        stop_ids = frozenset(int(t) for t in p.stop_token_ids)
        if not p.ignore_eos:
            stop_ids |= self.eos_ids
        return Seq(request, prompt, min(p.max_new_tokens, self.max_model_len - len(prompt)), stop_ids,
                   list(p.stop), max((len(s.encode()) for s in p.stop), default=0) + 4, generator,
                   max(0, top_logprobs), deliver)

    async def generate(self, request: GenerateRequest, top_logprobs: int = 0) -> EmbeddedCompletion:
        """Generate one completion (waits while paused). `top_logprobs` > 0 also returns, per output token,
        that many most likely (token, log-prob) pairs (an extension used by the HTTP server)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        seq = self._make_seq(request, _deliverer(loop, fut), top_logprobs)
        with self._cv:
            if self._closed:
                raise RuntimeError("engine is closed")
            self._waiting.append(seq)
            self._cv.notify()
        try:
            return await fut
        except asyncio.CancelledError:
            self._post(("cancel", seq, None))
            raise

    # ---- control ---------------------------------------------------------------------------------
    def _post(self, command: tuple) -> None:
        with self._cv:
            self._commands.append(command)
            self._cv.notify()

    async def _command(self, kind: str, arg: Any = None) -> Any:
        """Run a command on the scheduler thread between two steps and wait for its result."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._post((kind, arg, _deliverer(loop, fut)))
        return await fut

    async def pause(self, mode: str = "abort") -> None:
        """Stop decoding: `abort` returns in-flight requests now, `wait` lets them finish, `keep` freezes them."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"unknown pause mode '{mode}'; valid: {', '.join(PAUSE_MODES)}")
        with self._cv:
            self._paused = mode
        await self._command({"abort": "abort_all", "wait": "wait_idle", "keep": "barrier"}[mode])

    async def resume(self) -> None:
        """Resume; frozen requests continue and requests that arrived while paused start."""
        with self._cv:
            self._paused = None
            self._cv.notify()

    @property
    def paused(self) -> bool:
        return self._paused is not None

    async def abort(self, request_ids: list[str] | None = None) -> int:
        """Finish the named requests (all when None) now with finish_reason `abort`; returns how many."""
        return await self._command("abort_ids", None if request_ids is None else set(request_ids))

    async def update_weights(self, source: Any, version: int) -> None:
        """Load weights (state dict, nn.Module, HF checkpoint or peft adapter folder) and set the version.

        A partial state dict updates only the tensors it names; LoRA factors are merged (see
        `serving.engines.embedded_weights`). Raises WeightUpdateError, changing nothing, when the source does not fit.
        """
        spec = None
        if is_checkpoint_dir(source):
            source, spec = await asyncio.to_thread(read_folder, source)
        elif hasattr(source, "state_dict"):
            source = source.state_dict()
        await asyncio.to_thread(self._apply_weights, dict(source), spec, int(version))

    def _apply_weights(self, state: dict, spec, version: int) -> None:
        with self._model_lock, torch.no_grad():
            apply_update(self.model, state, self.lora, spec)
            self._runner.prefix.clear()
            self._runner.epoch += 1
            self._runner.version = version

    async def reset_prefix_cache(self) -> None:
        """Drop the KV kept for sticky request ids (vLLM's /reset_prefix_cache)."""
        await asyncio.to_thread(self._clear_prefixes)

    def _clear_prefixes(self) -> None:
        with self._model_lock:
            self._runner.prefix.clear()

    def set_version(self, version: int) -> None:
        """Set the weight version without loading weights (vLLM's /update_weight_version)."""
        with self._model_lock:
            self._runner.version = int(version)

    async def health(self) -> dict[str, Any]:
        r = self._runner
        return {"ok": self._thread.is_alive() and not self._closed, "version": r.version, "running": r.n_running,
                "waiting": len(self._waiting), "paused": self._paused is not None, "pause_mode": self._paused,
                "tokens_generated": r.tokens_generated, "tokens_per_s": round(r.tokens_per_s(), 2),
                "prefill_tokens": r.prefill_tokens, "stem_tokens_saved": r.stem_tokens_saved,
                "model": self.name, "max_batch_size": r.max_batch_size, "max_model_len": self.max_model_len,
                "kv_cache_bytes": r.kv.allocated_bytes, "prefix_cache": r.prefix.stats(),
                "decode_attention": cpu_attention.status() if r.native_attention else "sdpa",
                "forward": r.forward_status,
                "last_error": None if self._error is None else repr(self._error)}

    def close(self) -> None:
        """Stop the scheduler thread; waiting and running requests fail with RuntimeError."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # ---- the scheduler thread --------------------------------------------------------------------
    def _frozen(self) -> bool:
        return self._paused in ("keep", "abort")

    def _has_work(self) -> bool:
        r = self._runner
        return bool(self._commands or (self._paused is None and self._waiting and r.can_start_wave())
                    or (r.n_running and not self._frozen()))

    def _loop(self) -> None:
        idle_waiters: list = []
        r = self._runner
        while True:
            with self._cv:
                while not self._closed and not self._has_work():
                    self._cv.wait(timeout=1.0)
                if self._closed:
                    break
                commands, self._commands = self._commands, []
            admitted: list[Seq] = []
            try:
                with self._model_lock, torch.inference_mode():
                    idle_waiters += self._run_commands(commands)
                    with self._cv:
                        admitted = r.select_admissions(self._waiting) if self._paused is None else []
                    r.start_wave(admitted)
                    if not self._frozen():
                        self._step()
            except Exception as e:  # a failed forward pass fails the requests in it, not the engine
                self._error = e
                for seq in r.running() + admitted:
                    seq.deliver(e)
                r.reset()
            if not r.n_running:
                for deliver in idle_waiters:
                    deliver(None)
                idle_waiters = []
        error = RuntimeError("engine closed")
        for seq in r.running() + list(self._waiting):
            seq.deliver(error)
        for deliver in idle_waiters:
            deliver(error)

    def _run_commands(self, commands: list[tuple]) -> list:
        r = self._runner
        idle_waiters = []
        for kind, arg, deliver in commands:
            if kind == "cancel":
                r.abort(lambda s, seq=arg: s is seq)
                arg.done = True
                with self._cv:
                    if arg in self._waiting:
                        self._waiting.remove(arg)
            elif kind == "abort_all":
                deliver(r.abort(lambda s: True))
            elif kind == "abort_ids":
                n = r.abort(lambda s, ids=arg: ids is None or s.request.request_id in ids)
                with self._cv:
                    queued = [s for s in self._waiting if arg is None or s.request.request_id in arg]
                    for s in queued:
                        self._waiting.remove(s)
                for s in queued:
                    s.deliver(EmbeddedCompletion([], [], [], "abort", None, prompt_ids=s.prompt))
                deliver(n + len(queued))
            elif kind == "wait_idle":
                idle_waiters.append(deliver)
            else:  # barrier
                deliver(None)
        return idle_waiters

    def _step(self) -> None:
        r = self._runner
        if r.n_prefill:
            r.prefill_chunk()
        if r.n_dec:
            r.finish(r.decode_step())
        r.release_if_idle()


def completion_text(engine: Any, completion: Completion) -> str:
    """Decoded text of a completion's output tokens (special tokens dropped)."""
    return engine.tokenizer.decode(completion.output_ids, skip_special_tokens=True)
