"""What a prediction needs to know about a model that recipes do not say: parameters read per
token, bytes per parameter, layers, hidden size and the KV cache per token. Typed, one entry per
Hugging Face id, each with where its numbers come from (the models' config.json, GGUF headers
and cards).

The table is a cache: a model missing here is read from the model itself (its config.json or
GGUF header, advise/modelsource.py), never assumed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFacts:
    active_params_b: float
    """Parameters read per token, in billions (MoE: the active ones; without the embedding
    table, of which a token reads one row)."""
    bytes_per_param: float
    """NVFP4 4 bits + an FP8 scale per 16 = 0.5625; MXFP4 ~0.53 (BF16 attention lifts a model's
    mean); GPTQ-Int4 with 128-groups ~0.53; FP8 with block scales ~1.0; BF16 2."""
    layers: int
    hidden: int
    kv_bytes_per_token: float
    """K and V of one token over every attention layer (layers x kv heads x head dim x 2 x
    the cache's bytes per value)."""
    experts: int = 0
    """Routed experts per MoE layer (0: dense)."""
    experts_per_token: int = 0
    expert_share: float = 0.0
    """Share of the active parameters that are routed experts: with several requests in a step,
    more distinct experts are read (the rest is read once whatever the batch)."""
    mtp_gb: float = 0.0
    """What one step of the model's own MTP / NEXTN draft head reads (one decoder layer and the
    LM head), in GB."""
    note: str = ""


def kv(layers: int, kv_heads: int, head_dim: int, value_bytes: float) -> float:
    return layers * kv_heads * head_dim * 2 * value_bytes


FACTS: dict[str, ModelFacts] = {
    # Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 4 KV heads x 128, 128 experts, 8 per
    # token (experts: 8 x 3 x 4096 x 1536 x 94 = 14.2B of 22B active); NVFP4 0.5625 B/param.
    "nvidia/Qwen3-235B-A22B-FP4": ModelFacts(22.0, 0.5625, 94, 4096, kv(94, 4, 128, 2),
                                            128, 8, 0.65, note="NVFP4"),
    "Qwen/Qwen3-235B-A22B-GPTQ-Int4": ModelFacts(22.0, 0.53, 94, 4096, kv(94, 4, 128, 1),
                                                 128, 8, 0.65, note="GPTQ-Int4, fp8 KV cache"),
    # MiniMax-M2 config.json: 62 layers, hidden 3072, 8 KV heads x 128, 256 experts, 8 per token
    # (8 x 3 x 3072 x 1536 x 62 = 7.0B of 10B active); the recipe's KV cache is fp8.
    "nvidia/MiniMax-M2.7-NVFP4": ModelFacts(10.0, 0.5625, 62, 3072, kv(62, 8, 128, 1),
                                           256, 8, 0.70, note="NVFP4, fp8 KV cache"),
    "olka-fi/MiniMax-M2.7-MXFP4": ModelFacts(10.0, 0.53, 62, 3072, kv(62, 8, 128, 1),
                                            256, 8, 0.70, note="MXFP4 (the seed blog's)"),
    # Qwen3.6-27B-FP8: 64 layers (16 full attention, the rest Gated DeltaNet with a fixed state),
    # hidden 5120, 4 KV heads x 256; 27B minus the 1.3B embedding table (vocab 248k x 5120);
    # MTP head: one decoder layer (~0.4 GB) and the LM head (1.3 GB).
    "Qwen/Qwen3.6-27B-FP8": ModelFacts(25.3, 1.0, 64, 5120, kv(16, 4, 256, 2), mtp_gb=1.7,
                                      note="FP8, 16 of 64 layers keep a KV cache"),
    # gpt-oss-120b model card: 5.1B active, MXFP4 experts with BF16 attention (~0.6 B/param
    # overall), 36 layers, hidden 2880, 8 KV heads x 64, 128 experts, 4 per token
    # (4 x 3 x 2880 x 2880 x 36 = 3.6B of 5.1B).
    "openai/gpt-oss-120b": ModelFacts(5.1, 0.6, 36, 2880, kv(36, 8, 64, 2), 128, 4, 0.70,
                                      note="MXFP4 experts"),
    # ggml-org/gpt-oss-120b-GGUF (llama.cpp's own conversion, the gpt-oss-120b-gguf recipe):
    # llama-bench on a Spark reports it as 59.02 GiB, 116.83 B parameters (ggml-org/llama.cpp
    # benches/dgx-spark.md). Experts 3 x 2880 x 2880 x 128 x 36 = 114.7B in MXFP4 (17 bytes per
    # 32) = 60.9 GB, so the other 2.2B (attention, router, embedding, LM head) hold 2.5 GB,
    # 1.12 B/param. Per token: 4 of 128 experts (3.58B, 1.90 GB) + attention, router and LM head
    # (1.55B, 1.74 GB) = 5.13B, 3.64 GB: 0.71 B/param, experts 52 % of the bytes.
    "ggml-org/gpt-oss-120b-GGUF": ModelFacts(5.13, 0.71, 36, 2880, kv(36, 8, 64, 2), 128, 4,
                                             0.52, note="MXFP4 experts, GGUF"),
    # Qwen/Qwen3-235B-A22B-GGUF, the Q4_K_M files of the qwen3-235b-gguf-rpc recipe (143 GB
    # for 235B: 0.61 B/param); shapes from the config.json entry above: experts 14.2B of the
    # 21.6B read per token (attention 6.7B, LM head 0.62B).
    "Qwen/Qwen3-235B-A22B-GGUF": ModelFacts(21.6, 0.61, 94, 4096, kv(94, 4, 128, 2), 128, 8,
                                            0.66, note="Q4_K_M GGUF"),
    # Qwen3-235B-A22B-Instruct-2507: the Qwen3-235B-A22B shapes above; FP8 with 128x128 block
    # scales (~1.0 B/param); the qwen3-235b-fp8-pp3 recipe's KV cache is fp8.
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": ModelFacts(22.0, 1.0, 94, 4096, kv(94, 4, 128, 1),
                                                        128, 8, 0.65, note="FP8, fp8 KV cache"),
    # Qwen3.5-397B-A17B config.json: 60 layers (every 4th full attention, the rest Gated DeltaNet
    # with a fixed state: 15 keep a KV cache), hidden 4096, 2 KV heads x 256, 512 experts, 10 per
    # token of 1024 wide (10 x 3 x 4096 x 1024 x 60 = 7.5B of the 16B read per token, 17B less
    # the 1.0B embedding table); NEXTN head: one decoder layer's active part and the LM head.
    "Qwen/Qwen3.5-397B-A17B-FP8": ModelFacts(16.0, 1.0, 60, 4096, kv(15, 2, 256, 1), 512, 10,
                                            0.47, mtp_gb=1.3, note="FP8, fp8 KV cache"),
    "Intel/Qwen3.5-397B-A17B-int4-AutoRound": ModelFacts(16.0, 0.53, 60, 4096, kv(15, 2, 256, 1),
                                                        512, 10, 0.47,
                                                        note="INT4 AutoRound, fp8 KV cache"),
    # Nemotron 3 Ultra 550B-A55B (NVIDIA's release notes): 108 layers, hidden 8192, 512 experts,
    # 22 routed per token; mostly Mamba-2 layers with a fixed state and a few attention layers.
    # Estimated, not read from its config.json (not reachable offline): 12 attention layers of
    # 2 KV heads x 128 as in Nemotron 3's smaller members, experts ~75 % of the 55B active.
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4": ModelFacts(
        55.0, 0.5625, 108, 8192, kv(12, 2, 128, 1), 512, 22, 0.75,
        note="NVFP4, fp8 KV cache; attention layers estimated"),
    # Llama 3.3 70B: dense, 80 layers, hidden 8192, 8 KV heads x 128; NVIDIA's FP4 build.
    "nvidia/Llama-3.3-70B-Instruct-FP4": ModelFacts(69.0, 0.5625, 80, 8192, kv(80, 8, 128, 2),
                                                   note="NVFP4"),
    # Qwen3-8B config.json: 36 layers, hidden 4096, 8 KV heads x 128; BF16, 8.2B - 0.6B embedding.
    "Qwen/Qwen3-8B": ModelFacts(7.6, 2.0, 36, 4096, kv(36, 8, 128, 2), note="BF16"),
    # The lab's real GGUF (lab/sparklab/gguf_model.py): a llama of 8 layers, 256 wide, 4 heads
    # (2 KV) of 64, FFN 768, f16: 8 x 786k = 6.3M in the layers; its output matrix is tied to the
    # 128,256 x 256 embedding, which the LM head reads whole every token (32.8M): 39.1M.
    "sparklab/tiny-llama-gguf": ModelFacts(0.0391, 2.0, 8, 256, kv(8, 2, 64, 2),
                                          note="f16, the lab's tiny llama; LM head tied to the embedding"),
    # The same llama in Hugging Face's format for the lab's real vLLM (lab/sparklab/hf_model.py):
    # the same shapes, served in bf16 (--dtype bfloat16), so the same bytes per parameter.
    "sparklab/tiny-llama": ModelFacts(0.0391, 2.0, 8, 256, kv(8, 2, 64, 2),
                                      note="bf16, the lab's tiny llama; LM head tied to the embedding"),
}
