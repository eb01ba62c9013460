"""A real Hugging Face model for the lab's real vLLM: the lab's tiny llama in safetensors.

The same architecture and vocabulary as the GGUF one (sparklab/gguf_model.py: 8 layers, 256
wide, Llama 3's vocabulary from llama.cpp's `models/ggml-vocab-llama-bpe.gguf`), written as a
Hugging Face repo with PyPI's `safetensors` and numpy: `config.json` (LlamaForCausalLM),
`model.safetensors` (seeded random f16 weights, HF tensor names), `tokenizer.json` (the same
file as the GGUF repo's), `tokenizer_config.json` with Llama 3's chat template, and
`generation_config.json` (stops at <|eot_id|>). vLLM loads it as it would any Llama; what it
writes is nonsense, but every token is computed by the real vLLM.

Published as the lab hub's repo `sparklab/tiny-llama` next to the GGUF one; deterministic (the
same inputs give the same bytes) and rebuilt only when its inputs change (`.sparklab-inputs`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sparklab.gguf_model import CHAT_TEMPLATE, VOCAB, Shape, _vocab, publish_repo, tokenizer_json

REPO = "sparklab/tiny-llama"
WEIGHTS = "model.safetensors"
GENERATOR = 1
"""Bump when the way the model is written changes (it is part of the inputs' digest)."""
DEFAULT_SHAPE = Shape()


def inputs_digest(source: Path, shape: Shape) -> str:
    digest = hashlib.sha256((source / VOCAB).read_bytes())
    digest.update(json.dumps({"shape": asdict(shape), "generator": GENERATOR, "repo": REPO,
                              "template": CHAT_TEMPLATE}, sort_keys=True).encode())
    return digest.hexdigest()


def tensors(vocab_size: int, shape: Shape) -> dict[str, Any]:
    """Hugging Face's Llama tensor names and shapes ((out, in) for every projection)."""
    import numpy as np

    rng = np.random.default_rng(shape.seed)
    head_dim = shape.n_embd // shape.n_head
    kv_dim = head_dim * shape.n_head_kv

    def matrix(rows: int, cols: int) -> Any:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm() -> Any:
        return np.ones(shape.n_embd, dtype=np.float16)

    out = {"model.embed_tokens.weight": matrix(vocab_size, shape.n_embd)}
    for i in range(shape.n_layer):
        layer = f"model.layers.{i}"
        out[f"{layer}.input_layernorm.weight"] = norm()
        out[f"{layer}.self_attn.q_proj.weight"] = matrix(shape.n_embd, shape.n_embd)
        out[f"{layer}.self_attn.k_proj.weight"] = matrix(kv_dim, shape.n_embd)
        out[f"{layer}.self_attn.v_proj.weight"] = matrix(kv_dim, shape.n_embd)
        out[f"{layer}.self_attn.o_proj.weight"] = matrix(shape.n_embd, shape.n_embd)
        out[f"{layer}.post_attention_layernorm.weight"] = norm()
        out[f"{layer}.mlp.gate_proj.weight"] = matrix(shape.n_ff, shape.n_embd)
        out[f"{layer}.mlp.up_proj.weight"] = matrix(shape.n_ff, shape.n_embd)
        out[f"{layer}.mlp.down_proj.weight"] = matrix(shape.n_embd, shape.n_ff)
    out["model.norm.weight"] = norm()  # no lm_head.weight: tied to the embedding
    return out


def repo_files(vocab: dict[str, Any], shape: Shape) -> dict[str, str]:
    """The repo's JSON files (the weights are written apart)."""
    eot = vocab["tokens"].index("<|eot_id|>")
    bos, eos = vocab["tokens"][vocab["bos"]], vocab["tokens"][vocab["eos"]]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": shape.n_embd, "num_hidden_layers": shape.n_layer,
              "num_attention_heads": shape.n_head, "num_key_value_heads": shape.n_head_kv,
              "head_dim": shape.n_embd // shape.n_head, "intermediate_size": shape.n_ff,
              "max_position_embeddings": shape.n_ctx, "vocab_size": len(vocab["tokens"]),
              "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
              "tie_word_embeddings": True, "bos_token_id": vocab["bos"],
              "eos_token_id": [vocab["eos"], eot], "torch_dtype": "float16"}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos,
                        "eos_token": "<|eot_id|>", "model_max_length": shape.n_ctx,
                        "clean_up_tokenization_spaces": True, "chat_template": CHAT_TEMPLATE}
    generation = {"bos_token_id": vocab["bos"], "eos_token_id": [vocab["eos"], eot],
                  "do_sample": True, "temperature": 0.6, "top_p": 0.9}
    del eos  # the <|end_of_text|> id is in eos_token_id; chats end at <|eot_id|>

    def dump(data: dict[str, Any]) -> str:
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    return {"config.json": dump(config), "tokenizer_config.json": dump(tokenizer_config),
            "generation_config.json": dump(generation),
            "tokenizer.json": json.dumps(tokenizer_json(vocab), ensure_ascii=False),
            "README.md": README}


README = f"""# {REPO}

A Llama (LlamaForCausalLM) with seeded random weights and Llama 3's vocabulary, written by
sparklab (lab/sparklab/hf_model.py) with PyPI's `safetensors` for the simulated DGX Spark lab's
real vLLM. What it writes is nonsense. The same shape and vocabulary as sparklab/tiny-llama-gguf.
"""


def publish(hub: Path, source: Path, shape: Shape = DEFAULT_SHAPE) -> Path:
    """The repo folder under `hub`, written when missing or stale."""
    from safetensors.numpy import save_file

    def write(staging: Path) -> None:
        vocab = _vocab(source)
        save_file(tensors(len(vocab["tokens"]), shape), str(staging / WEIGHTS),
                  metadata={"format": "pt"})
        (staging / WEIGHTS).chmod(0o644)  # safetensors writes 0600; the hub is read by anyone
        for name, text in repo_files(vocab, shape).items():
            (staging / name).write_text(text)

    return publish_repo(hub / REPO, inputs_digest(source, shape), write)
