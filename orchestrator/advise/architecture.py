"""A model's architecture read from the model itself (pure: bytes and dicts in, ModelFacts out).

Two readers, both exact about what they can see:
- a GGUF header (llama.cpp's files): its key-values ({arch}.block_count, .embedding_length,
  .expert_count, .expert_used_count, .attention.head_count_kv, .attention.key_length) and its
  tensor table, whose shapes and ggml types give every tensor's bytes: what a token reads is
  every tensor but the embedding table (one row) and, of the routed experts (`*_exps`), k of E;
- a Hugging Face config.json (num_hidden_layers, hidden_size, heads and head_dim,
  num_experts / num_local_experts / n_routed_experts and num_experts_per_tok, intermediate
  sizes, vocab, quantization_config): parameters counted per layer, bytes per parameter from
  the quantization method.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from orchestrator.advise.facts import ModelFacts, kv

GGML_TYPES: dict[int, tuple[int, int]] = {
    # ggml type id: (bytes per block, values per block), ggml/include/ggml.h + ggml.c's type_traits
    0: (4, 1), 1: (2, 1), 2: (18, 32), 3: (20, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32),
    9: (36, 32), 10: (84, 256), 11: (110, 256), 12: (144, 256), 13: (176, 256), 14: (210, 256),
    15: (292, 256), 16: (66, 256), 17: (74, 256), 18: (98, 256), 19: (50, 256), 20: (18, 32),
    21: (110, 256), 22: (82, 256), 23: (136, 256), 24: (1, 1), 25: (2, 1), 26: (4, 1),
    27: (8, 1), 28: (8, 1), 29: (56, 256), 30: (2, 1), 34: (54, 256), 35: (66, 256),
    39: (17, 32),
}
"""F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q8_K, IQ2_XXS..IQ4_XS, I8..F64, IQ1_M,
BF16, TQ1_0, TQ2_0, MXFP4."""
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}


class Unreadable(ValueError):
    """The bytes or the config do not say what a prediction needs (the reason is the text)."""


class Truncated(Unreadable):
    """The header goes on past the bytes given: read more of the file."""


@dataclass
class GgufHeader:
    values: dict[str, Any]
    tensors: list[tuple[str, int, int]] = field(default_factory=list)
    """(name, element count, ggml type)."""

    def key(self, suffix: str, default: Any = None) -> Any:
        arch = self.values.get("general.architecture", "")
        return self.values.get(f"{arch}.{suffix}", default)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise Truncated(f"the GGUF header goes past the first {len(self.data)} bytes")
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += size
        return value

    def string(self) -> str:
        size = self.take("<Q")
        if self.at + size > len(self.data):
            raise Truncated(f"the GGUF header goes past the first {len(self.data)} bytes")
        text = self.data[self.at:self.at + size].decode("utf-8", "replace")
        self.at += size
        return text

    def value(self, kind: int) -> Any:
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, count = self.take("<I"), self.take("<Q")
            if inner in SCALARS and inner != 7:  # skip long arrays (vocabularies) in one go
                size = struct.calcsize(SCALARS[inner])
                if count > 4096:
                    if self.at + size * count > len(self.data):
                        raise Truncated(f"the GGUF header goes past the first {len(self.data)} bytes")
                    self.at += size * count
                    return None
            items = [self.value(inner) for _ in range(count)]
            return None if count > 4096 else items
        raise Unreadable(f"unknown GGUF value type {kind}")


def read_gguf_header(data: bytes) -> GgufHeader:
    """The key-values and tensor table at the start of a GGUF file (version 2 or 3)."""
    reader = _Reader(data)
    if data[:4] != b"GGUF":
        raise Unreadable("not a GGUF file (no GGUF magic)")
    reader.at = 4
    version = reader.take("<I")
    if version not in (2, 3):
        raise Unreadable(f"GGUF version {version} (this reader knows 2 and 3)")
    tensors, count = reader.take("<Q"), reader.take("<Q")
    values = {}
    for _ in range(count):
        key = reader.string()
        values[key] = reader.value(reader.take("<I"))
    header = GgufHeader(values)
    for _ in range(tensors):
        name = reader.string()
        dims = [reader.take("<Q") for _ in range(reader.take("<I"))]
        kind = reader.take("<I")
        reader.take("<Q")  # offset in the data section
        elements = 1
        for d in dims:
            elements *= d
        header.tensors.append((name, elements, kind))
    return header


def tensor_bytes(elements: int, kind: int) -> float:
    if kind not in GGML_TYPES:
        raise Unreadable(f"unknown ggml tensor type {kind}")
    block_bytes, block = GGML_TYPES[kind]
    return elements / block * block_bytes


def facts_from_gguf(headers: list[GgufHeader], note: str) -> ModelFacts:
    """Every part of a (split) GGUF: the first part's key-values, every part's tensors."""
    first = headers[0]
    layers = int(first.key("block_count") or 0)
    hidden = int(first.key("embedding_length") or 0)
    if not layers or not hidden:
        raise Unreadable("the GGUF header has no block_count / embedding_length")
    experts = int(first.key("expert_count") or 0)
    used = int(first.key("expert_used_count") or 0)
    tensors = [t for h in headers for t in h.tensors]
    names = {name for name, _, _ in tensors}
    dense_b = dense_p = expert_b = expert_p = 0.0
    for name, elements, kind in tensors:
        size = tensor_bytes(elements, kind)
        if name == "token_embd.weight" and "output.weight" in names:
            continue  # a token reads one row of the embedding table
        if "_exps." in name:
            expert_b, expert_p = expert_b + size, expert_p + elements
        else:
            dense_b, dense_p = dense_b + size, dense_p + elements
    if experts and used and expert_b:
        expert_b, expert_p = expert_b * used / experts, expert_p * used / experts
    active_b, active_p = dense_b + expert_b, dense_p + expert_p
    heads = first.key("attention.head_count") or 1
    kv_heads = first.key("attention.head_count_kv", heads)
    per_layer = kv_heads if isinstance(kv_heads, list) else [kv_heads] * layers
    heads_n = heads if isinstance(heads, int) else max(heads)
    key_len = int(first.key("attention.key_length") or hidden // heads_n)
    value_len = int(first.key("attention.value_length") or key_len)
    kv_bytes = sum(int(h) for h in per_layer) * (key_len + value_len) * 2  # f16 cache
    return ModelFacts(active_p / 1e9, active_b / active_p, layers, hidden, kv_bytes, experts, used,
                      expert_b / active_b if experts else 0.0, note=note)


QUANT_BYTES = {"fp8": 1.0, "mxfp4": 0.53, "nvfp4": 0.5625, "modelopt_fp4": 0.5625,
               "gptq": 0.53, "awq": 0.53, "bitsandbytes": 0.53, "compressed-tensors": 0.53}
DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "float8_e4m3fn": 1.0}


def weight_bytes(config: dict[str, Any]) -> tuple[float, str]:
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_method") or quant.get("quant_algo") or "").lower()
    if method in ("modelopt", "modelopt_fp4") or "fp4" in str(quant.get("quant_algo", "")).lower():
        method = "nvfp4"
    if method in ("gptq", "awq") and quant.get("bits"):
        return int(quant["bits"]) / 8 + 0.03, f"{method.upper()} {quant['bits']}-bit"
    if method in QUANT_BYTES:
        return QUANT_BYTES[method], method.upper()
    if method:
        raise Unreadable(f"quantization_config.quant_method {method!r} is not one advise knows")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise Unreadable(f"torch_dtype {dtype!r} is not one advise knows")
    return DTYPE_BYTES[dtype], dtype.upper().replace("BFLOAT16", "BF16").replace("FLOAT16", "FP16")


def facts_from_config(config: dict[str, Any], note: str) -> ModelFacts:
    """Parameters per token from config.json's shapes; MoE: k of E routed experts."""
    text = {**config, **(config.get("text_config") or {})}
    try:
        layers, hidden = int(text["num_hidden_layers"]), int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        vocab = int(text["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise Unreadable(f"config.json lacks {exc}") from None
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    experts = int(text.get("num_experts") or text.get("num_local_experts")
                  or text.get("n_routed_experts") or 0)
    used = int(text.get("num_experts_per_tok") or 0)
    if experts and not used:
        raise Unreadable("config.json has experts but no num_experts_per_tok")
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    inter = int(text.get("intermediate_size") or 4 * hidden)
    dense_layers = int(text.get("first_k_dense_replace") or 0) if experts else layers
    moe_inter = int(text.get("moe_intermediate_size") or inter)
    shared = int(text.get("shared_expert_intermediate_size") or 0)
    shared += int(text.get("n_shared_experts") or 0) * moe_inter
    expert_active = (layers - dense_layers) * used * 3 * hidden * moe_inter if experts else 0
    rest = layers * attention + dense_layers * 3 * hidden * inter \
        + (layers - dense_layers) * (3 * hidden * shared + hidden * experts) + vocab * hidden
    bpp, label = weight_bytes({**text, **config})
    types = text.get("layer_types") or []
    kv_layers = sum(1 for t in types if "linear" not in str(t)) if types else layers
    mtp = int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0)
    active = expert_active + rest
    return ModelFacts(active / 1e9, bpp, layers, hidden, kv(kv_layers, kv_heads, head_dim, 2),
                      experts, used, expert_active / active if experts else 0.0,
                      mtp_gb=round(mtp * (attention + 3 * hidden * inter) * bpp / 1e9
                                   + vocab * hidden * 2 / 1e9, 2) if mtp else 0.0,
                      note=f"{label}; {note}")
