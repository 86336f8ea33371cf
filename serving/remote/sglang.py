"""Client for SGLang's native server API (`backend="sglang"`).

Wire format (SGLang's documented native API, as AReaL drives it):

    generate   POST /generate {"input_ids": [ids], "rid": <call id>, "return_logprob": true,
               "sampling_params": {"max_new_tokens", "temperature", "top_p", "top_k" (-1: off),
               "stop", "stop_token_ids", "no_stop_trim": true, "sampling_seed"?}}
               -> {"meta_info": {"output_token_logprobs": [[logprob, token_id, text|null], ...],
                   "finish_reason": {"type": "stop"|"length"|"abort", "matched": id|str|null}}}
    pause      POST /pause_generation {"mode": "abort"}     resume  POST /continue_generation
    stragglers POST /abort_request {"rid": <call id>}
    weights    POST /update_weights_from_disk {"model_path", "weight_version", "flush_cache": true}
               -> {"success": bool, "message": str}
    version    GET /model_info (or the older /get_model_info, /get_weight_version) -> weight_version
    load       GET /get_load (optional)
    progress   GET /metrics (with --enable-metrics): sglang:generation_tokens_total

SGLang has no server-side "wait" pause; `pause("wait")` drains this client's calls first and then
pauses the server in place. "Abort before prefill" replies carry no tokens, which the continuation
loop (`serving.protocol.generate_continuing`) handles like any other abort.
"""

from __future__ import annotations

from typing import Any

from serving.protocol import Completion, GenerateRequest, PauseMode
from serving.remote.client import RemoteEngine
from serving.remote.transport import EngineRequestError


class SGLangEngine(RemoteEngine):
    """InferenceEngine over one SGLang server."""

    backend = "sglang"

    _version_paths = ("/model_info", "/get_model_info", "/get_weight_version")  # newest first

    async def _connect(self) -> None:
        return None  # SGLang needs no model name in requests; the base reads the weight version

    def _generate_payload(self, request: GenerateRequest, max_new_tokens: int, call_id: str) -> tuple[str, dict]:
        s = request.sampling
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1, "no_stop_trim": True}
        params.update(self._stop_and_seed(s, "sampling_seed"))
        return "/generate", {"input_ids": list(request.prompt_ids), "rid": call_id, "sampling_params": params,
                             "return_logprob": True, "stream": False}

    def _parse_generate(self, body: Any, sent_version: int) -> Completion:
        try:
            meta = body["meta_info"]
            finish = meta.get("finish_reason") or {"type": "abort"}
            kind = finish.get("type") if isinstance(finish, dict) else str(finish)
            pairs = meta.get("output_token_logprobs") or []
            ids = [int(p[1]) for p in pairs]
            logprobs = [float(p[0]) for p in pairs]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise EngineRequestError(self.url, "/generate", 502,
                                     f"unexpected reply ({type(e).__name__}: {e}): {str(body)[:300]}") from e
        reason = kind if kind in ("stop", "length", "abort") else "stop"
        matched = finish.get("matched") if isinstance(finish, dict) and reason == "stop" else None
        return Completion(ids, logprobs, [sent_version] * len(ids), reason, matched)

    async def _server_pause(self, mode: PauseMode) -> None:
        # "wait" reaches here after this client's calls drained: hold everyone else's in place.
        await self._request("POST", "/pause_generation", json={"mode": "abort" if mode == "abort" else "in_place"},
                            timeout=self.request_timeout_s)

    async def _server_resume(self) -> None:
        await self._request("POST", "/continue_generation", json={}, timeout=60)

    async def _abort_calls(self, calls: list) -> bool:
        try:
            for call in calls:
                await self._request("POST", "/abort_request", json={"rid": call.call_id}, timeout=30)
        except EngineRequestError as e:
            if e.status in (404, 405):
                return False
            raise
        return True

    async def _load_weights(self, path: str, version: int) -> None:
        reply = await self._request("POST", "/update_weights_from_disk", timeout=self.request_timeout_s,
                                    json={"model_path": path, "weight_version": str(version), "flush_cache": True})
        if isinstance(reply, dict) and not reply.get("success", True):
            raise EngineRequestError(self.url, "/update_weights_from_disk", 400, str(reply.get("message")))

    async def _label_weights(self, version: int) -> None:
        return None  # /update_weights_from_distributed set the version and flushed the cache already

    async def init_weights_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                 group_name: str) -> None:
        """Join the NCCL weight-update group learner rank 0 hosts (serving/remote/weight_transfer.py)."""
        await self._request("POST", "/init_weights_update_group", timeout=self.request_timeout_s,
                            json={"master_address": master_address, "master_port": master_port,
                                  "rank_offset": rank_offset, "world_size": world_size, "group_name": group_name,
                                  "backend": "nccl"})

    async def update_weights_from_distributed(self, meta: dict[str, list], group_name: str, version: int) -> None:
        """Receive the tensors `meta` names (`weight_transfer.wire_meta`) by NCCL broadcast, as `version`;
        learner rank 0 broadcasts them meanwhile. Call while paused, as `update_weights`."""
        reply = await self._request("POST", "/update_weights_from_distributed", timeout=self.request_timeout_s,
                                    json={**meta, "group_name": group_name, "flush_cache": True,
                                          "weight_version": str(version)})
        if isinstance(reply, dict) and not reply.get("success", True):
            raise EngineRequestError(self.url, "/update_weights_from_distributed", 400, str(reply.get("message")))
        self._set_version(int(version))

    async def _server_figures(self, health_body: dict) -> dict[str, Any]:
        figures: dict[str, Any] = {"server_version": await self._weight_version()}
        try:
            load = await self._request("GET", "/get_load", timeout=10)
            rows = load if isinstance(load, list) else [load] if isinstance(load, dict) else []
            figures["server_load"] = sum(int(r.get("num_reqs", 0)) + int(r.get("num_waiting_reqs", 0))
                                         for r in rows if isinstance(r, dict))
        except (EngineRequestError, ValueError, TypeError):
            pass
        figures.update(await self._generated_tokens("sglang:generation_tokens_total"))  # with --enable-metrics
        return figures
