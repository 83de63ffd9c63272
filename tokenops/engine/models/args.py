"""One normalised view of a Hugging Face ``config.json`` for every supported family.

Configs written by different ``transformers`` versions disagree on spelling
(``rope_scaling`` + ``rope_theta`` vs ``rope_parameters``; ``layer_types`` vs
``use_sliding_window``/``max_window_layers`` vs Gemma's alternating patterns);
:meth:`ModelArgs.from_hf` reads them all so the model code sees one shape. Gemma 2/3
and Phi-3 (and Gemma 1) are Llama-shaped decoders with a few switches (see the Gemma fields below).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenops.engine.models.rope import SUPPORTED_ROPE_TYPES, RopeSpec

__all__ = ["SUPPORTED_ROPE_TYPES", "ModelArgs"]

_QWEN_STYLE_WINDOW = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")
_GEMMA = ("gemma", "gemma2", "gemma3_text")
_GEMMA_SANDWICH = ("gemma2", "gemma3_text")  # norms after attention and around the MLP, query_pre_attn_scalar


@dataclass(slots=True)
class ModelArgs:
    """Architecture hyper-parameters the model modules need."""

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    layer_windows: list[int | None] = field(default_factory=list)
    # MoE (num_experts == 0 means dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: list[bool] = field(default_factory=list)
    # Phi-3 (partial_rotary_factor): leading dimensions of each head that rotate (0: all)
    rotary_dim: int = 0
    # Gemma (1, 2, 3; the sandwich norms, scalar and caps from Gemma 2)
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight), in float32
    embed_scale: float = 1.0  # embeddings multiplied by sqrt(hidden_size)
    sandwich_norms: bool = False  # norms after attention and around the MLP (pre/post_feedforward_layernorm)
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power (else head_dim's)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the mask
    final_softcap: float | None = None  # the same on the logits
    local_rope_theta: float | None = None  # Gemma 3: the base of the sliding-window layers' rotary table
    local_rope_scaling: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads {self.num_kv_heads}"
            )
        if not self.rotary_dim:
            self.rotary_dim = self.head_dim
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary dimension {self.rotary_dim} must be even and at most head_dim {self.head_dim}")
        self.rope_spec()  # validates the rope type and its fields
        if self.local_rope_theta is not None:
            self.rope_spec(local=True)
        if not self.layer_windows:
            self.layer_windows = [None] * self.num_layers
        if not self.moe_layers:
            self.moe_layers = [self.num_experts > 0] * self.num_layers
        assert len(self.layer_windows) == self.num_layers and len(self.moe_layers) == self.num_layers

    @property
    def is_moe(self) -> bool:
        return any(self.moe_layers)

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def rope_spec(self, local: bool = False) -> RopeSpec:
        """The rotary table of the global layers, or (``local``) of Gemma 3's sliding-window layers."""
        if local:
            assert self.local_rope_theta is not None
            return RopeSpec(
                self.local_rope_theta, self.rotary_dim, self.max_position_embeddings, self.local_rope_scaling
            )
        return RopeSpec(self.rope_theta, self.rotary_dim, self.max_position_embeddings, self.rope_scaling)

    def uses_local_rope(self, layer_idx: int) -> bool:
        return self.local_rope_theta is not None and self.layer_windows[layer_idx] is not None

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], architecture: str) -> ModelArgs:
        """Read a ``config.json`` dict; ``architecture`` is the HF class name."""
        model_type = cfg.get("model_type", "")
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        num_layers = cfg["num_hidden_layers"]
        if cfg.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention (an embedding model, not a causal LM) is not supported")
        rope, local_rope = _rope_fields(cfg, model_type)
        is_gemma = model_type in _GEMMA
        is_sandwich = model_type in _GEMMA_SANDWICH
        head_dim = cfg.get("head_dim") or (256 if is_gemma else hidden // num_heads)  # Gemma's default
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or ("gelu_pytorch_tanh" if is_gemma else "silu")
        if (
            is_gemma and act == "gelu"
        ):  # early Gemma configs: "gelu" meant the tanh approximation (as transformers reads it)
            act = "gelu_pytorch_tanh"
        rotary_dim = int(head_dim * rope.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
        is_qwen = model_type in _QWEN_STYLE_WINDOW
        is_qwen2_family = model_type in ("qwen2", "qwen2_moe")
        moe = _moe_fields(cfg, model_type, num_layers)
        return cls(
            architecture=architecture,
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg.get("intermediate_size", 0),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rope_theta=float(rope.pop("rope_theta", 10000.0)),
            rope_scaling=rope,
            hidden_act=act,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", is_gemma)),
            qkv_bias=bool(cfg.get("qkv_bias", True)) if is_qwen2_family else bool(cfg.get("attention_bias", False)),
            o_bias=False if is_qwen2_family or model_type == "mistral" else bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
            layer_windows=_layer_windows(cfg, num_layers, is_qwen),
            rotary_dim=rotary_dim,
            norm_offset=1.0 if is_gemma else 0.0,
            embed_scale=hidden**0.5 if is_gemma else 1.0,
            sandwich_norms=is_sandwich,
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar", 256) if is_sandwich else None,
            # absent keys take transformers' defaults (Gemma 2 caps both; null turns a cap off)
            attn_softcap=cfg.get("attn_logit_softcapping", 50.0 if model_type == "gemma2" else None) or None,
            final_softcap=cfg.get("final_logit_softcapping", 30.0 if model_type == "gemma2" else None) or None,
            local_rope_theta=None if local_rope is None else float(local_rope.pop("rope_theta")),
            local_rope_scaling=local_rope or {},
            **moe,
        )


def _normalised_rope(rope: dict[str, Any], theta: float) -> dict[str, Any]:
    rope = dict(rope)
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    rope.setdefault("rope_type", "default")
    rope.setdefault("rope_theta", theta)
    return rope


def _rope_fields(cfg: dict[str, Any], model_type: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The global rope dict (with ``rope_theta``) and Gemma 3's local one (None elsewhere)."""
    params = dict(cfg.get("rope_parameters") or {})
    local = None
    if model_type == "gemma3_text":
        # transformers >= 5 keys the parameters by layer type; older configs spell out
        # rope_theta (global), rope_local_base_freq (local) and rope_scaling (global only)
        if "full_attention" in params or "sliding_attention" in params:
            rope = _normalised_rope(params.get("full_attention") or {}, 1_000_000.0)
            local = _normalised_rope(params.get("sliding_attention") or {}, 10_000.0)
        else:
            rope = _normalised_rope(params or cfg.get("rope_scaling") or {}, cfg.get("rope_theta", 1_000_000.0))
            local = _normalised_rope({}, cfg.get("rope_local_base_freq", 10_000.0))
        return rope, local
    rope = _normalised_rope(params or cfg.get("rope_scaling") or {}, cfg.get("rope_theta", 10000.0))
    if model_type == "phi3":
        if rope["rope_type"] in ("su", "yarn"):  # Phi-3's names for LongRoPE (as transformers reads them)
            rope["rope_type"] = "longrope"
        if rope["rope_type"] == "longrope":
            rope.setdefault(
                "original_max_position_embeddings",
                cfg.get("original_max_position_embeddings") or cfg.get("max_position_embeddings", 4096),
            )
    return rope, local


def _layer_windows(cfg: dict[str, Any], num_layers: int, is_qwen: bool) -> list[int | None]:
    window = cfg.get("sliding_window")
    if not window:
        return [None] * num_layers
    types = cfg.get("layer_types")
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    model_type = cfg.get("model_type")
    if model_type == "gemma2":  # configs before layer_types: even layers slide
        return [window if i % 2 == 0 else None for i in range(num_layers)]
    if model_type == "gemma3_text":  # every sliding_window_pattern-th layer is global
        pattern = cfg.get("sliding_window_pattern", 6)
        return [window if (i + 1) % pattern else None for i in range(num_layers)]
    if is_qwen:
        if not cfg.get("use_sliding_window", False):
            return [None] * num_layers
        first = cfg.get("max_window_layers", num_layers)
        return [window if i >= first else None for i in range(num_layers)]
    return [window] * num_layers


def _moe_fields(cfg: dict[str, Any], model_type: str, num_layers: int) -> dict[str, Any]:
    num_experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    if not num_experts:
        return {}
    step = cfg.get("decoder_sparse_step", 1) or 1
    dense = set(cfg.get("mlp_only_layers") or [])
    return {
        "num_experts": num_experts,
        "num_experts_per_tok": cfg["num_experts_per_tok"],
        "moe_intermediate_size": cfg.get("moe_intermediate_size") or cfg.get("intermediate_size", 0),
        "shared_expert_intermediate_size": cfg.get("shared_expert_intermediate_size", 0)
        if model_type == "qwen2_moe"
        else 0,
        # Mixtral always renormalises the top-k weights; Qwen MoE makes it a flag.
        "norm_topk_prob": True if model_type == "mixtral" else bool(cfg.get("norm_topk_prob", False)),
        "moe_layers": [i not in dense and (i + 1) % step == 0 for i in range(num_layers)],
    }
