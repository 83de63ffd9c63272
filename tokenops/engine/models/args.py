"""One normalised view of a Hugging Face ``config.json`` for every supported family.

Configs written by different ``transformers`` versions disagree on spelling
(``rope_scaling`` + ``rope_theta`` vs ``rope_parameters``; ``layer_types`` vs
``use_sliding_window``/``max_window_layers``); :meth:`ModelArgs.from_hf` reads
them all so the model code sees one shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_QWEN_STYLE_WINDOW = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


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

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads {self.num_kv_heads}")
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        if not self.layer_windows:
            self.layer_windows = [None] * self.num_layers
        if not self.moe_layers:
            self.moe_layers = [self.num_experts > 0] * self.num_layers
        assert len(self.layer_windows) == self.num_layers and len(self.moe_layers) == self.num_layers

    @property
    def is_moe(self) -> bool:
        return any(self.moe_layers)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], architecture: str) -> ModelArgs:
        """Read a ``config.json`` dict; ``architecture`` is the HF class name."""
        model_type = cfg.get("model_type", "")
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        num_layers = cfg["num_hidden_layers"]
        rope = dict(cfg.get("rope_parameters") or {})
        if not rope:
            rope = dict(cfg.get("rope_scaling") or {})
            rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        rope.setdefault("rope_type", "default")
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
            head_dim=cfg.get("head_dim") or hidden // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rope_theta=float(rope.pop("rope_theta", 10000.0)),
            rope_scaling=rope,
            hidden_act=cfg.get("hidden_act", "silu"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("qkv_bias", True)) if is_qwen2_family else bool(cfg.get("attention_bias", False)),
            o_bias=False if is_qwen2_family or model_type == "mistral" else bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            layer_windows=_layer_windows(cfg, num_layers, is_qwen),
            **moe,
        )


def _layer_windows(cfg: dict[str, Any], num_layers: int, is_qwen: bool) -> list[int | None]:
    window = cfg.get("sliding_window")
    if not window:
        return [None] * num_layers
    types = cfg.get("layer_types")
    if types:
        return [window if t == "sliding_attention" else None for t in types]
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
        "shared_expert_intermediate_size": cfg.get("shared_expert_intermediate_size", 0) if model_type == "qwen2_moe" else 0,
        # Mixtral always renormalises the top-k weights; Qwen MoE makes it a flag.
        "norm_topk_prob": True if model_type == "mixtral" else bool(cfg.get("norm_topk_prob", False)),
        "moe_layers": [i not in dense and (i + 1) % step == 0 for i in range(num_layers)],
    }
