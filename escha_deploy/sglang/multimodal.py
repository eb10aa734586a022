"""Multimodal bytes SGLang reserves out of the KV budget, as data (pure).

SGLang 0.5.19's ``srt/mem_cache/kv_cache_configurator.py: mm_runtime_reservation_gb`` takes
``SGLANG_VLM_CACHE_SIZE_MB`` (100 by default, ``srt/environ.py``) plus, where
``--mm-feature-transport`` is ``cuda_ipc`` or ``cuda_vmm``, ``SGLANG_MM_FEATURE_CACHE_MB`` (1,024)
out of the memory the weights leave (``rest_memory = available - slack - mm_reservation_gb``,
before the mamba and KV pools are sized), for a model whose ``ModelConfig.is_multimodal`` is
true (``srt/configs/model_config.py: ModelConfig.__init__``):

    is_multimodal = enable_multimodal and not config.language_model_only
                    and (architecture in multimodal_model_archs or has_multimodal_subconfig)

``enable_multimodal``: ``--enable-multimodal``, else on except for the architectures SGLang turns
it off for by default (``mm_disabled_models``, with SGLang's own model classes; a MiMo-V2 without
both a vision and an audio config). ``has_multimodal_subconfig``: the config nests its text model
(``get_hf_text_config``: ``thinker_config``, ``llm_config``, ``language_config``, ``text_config``)
or, with ``--model-impl transformers``, has a vision or audio config. 0.5.21 and 0.5.23 keep the
function and the rule; their architecture lists grow (each release's ``facts.yaml``:
``multimodal_architectures_added``). "GB" there is
GiB (``get_available_gpu_memory`` divides by 1 << 30), so the bytes are MB x 2**20.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: ``srt/configs/model_config.py: multimodal_model_archs`` of 0.5.19 (MIMO_V2_MULTIMODAL_ARCHS inlined).
MULTIMODAL_ARCHITECTURES = frozenset({
    "CLIPModel", "Cohere2VisionForConditionalGeneration", "DeepseekVL2ForCausalLM",
    "Ernie4_5_VLMoeForConditionalGeneration", "MiniMaxM3SparseForConditionalGeneration",
    "Gemma3ForConditionalGeneration", "Gemma3nForConditionalGeneration", "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration", "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration",
    "GlmOcrForConditionalGeneration", "GlmAsrForConditionalGeneration", "GlmImageForConditionalGeneration",
    "Grok1VForCausalLM", "Grok1AForCausalLM", "LlavaLlamaForCausalLM", "Llama4ForConditionalGeneration",
    "LlavaMistralForCausalLM", "LlavaQwenForCausalLM", "LlavaForConditionalGeneration", "LlavaVidForCausalLM",
    "Lfm2VlForConditionalGeneration", "LightOnOCRForConditionalGeneration", "MiMoV2ForCausalLM",
    "MiMoV2ASRForCausalLM", "MiniCPMO", "MiniCPMV", "Mistral3ForConditionalGeneration", "MultiModalityCausalLM",
    "MllamaForConditionalGeneration", "MossVLForConditionalGeneration", "NemotronH_Nano_VL_V2",
    "NemotronH_Nano_Omni_Reasoning_V3", "MuseGlimmerForConditionalGeneration", "PixtralForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration", "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration", "Qwen3ASRForConditionalGeneration",
    "Qwen3OmniMoeForConditionalGeneration", "KimiVLForConditionalGeneration",
    "LocateAnythingForConditionalGeneration", "InternVLChatModel", "InternS1ForConditionalGeneration",
    "InternS1ProForConditionalGeneration", "Phi4MMForCausalLM", "VoxtralForConditionalGeneration",
    "WhisperForConditionalGeneration", "Step3VLForConditionalGeneration", "POINTSV15ChatModel",
    "DotsVLMForCausalLM", "Dots3NoteForCausalLM", "DotsOCRForCausalLM", "Sarashina2VisionForCausalLM",
    "NVILAForConditionalGeneration", "NVILALiteForConditionalGeneration", "DeepseekOCRForCausalLM",
    "UnlimitedOCRForCausalLM", "JetVLMForConditionalGeneration", "PaddleOCRVLForConditionalGeneration",
    "MiDashengLMModel", "StepVLForConditionalGeneration", "Step3p7ForConditionalGeneration",
    "KimiK25ForConditionalGeneration",
})
#: ``mm_disabled_models``: multimodal off by default for these (first architecture), with
#: SGLang's own model classes, unless ``--enable-multimodal``.
OFF_BY_DEFAULT = frozenset({"Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration",
                            "Step3VLForConditionalGeneration", "InklingForConditionalGeneration"})
VLM_CACHE_MB = 100  # SGLANG_VLM_CACHE_SIZE_MB's default
FEATURE_CACHE_MB = 1024  # SGLANG_MM_FEATURE_CACHE_MB's default
SOURCE = "srt/mem_cache/kv_cache_configurator.py: mm_runtime_reservation_gb; srt/configs/model_config.py: is_multimodal"


@dataclass(frozen=True)
class Reservation:
    """What SGLang reserves for multimodal allocations per rank: ``bytes`` (0: not multimodal),
    ``why`` in words, with the rule's source."""

    bytes: int
    why: str
    source: str = SOURCE


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def reservation(architectures: Sequence[str], *, text_subconfig: bool, vision_or_audio: bool,
                language_model_only: bool, extra_args: Sequence[str] = (), release: str | None = None,
                both_vision_and_audio: bool = False) -> Reservation:
    """The multimodal reservation for a model folder's config.json facts and the server's extra
    flags (``--enable-multimodal``, ``--model-impl``, ``--mm-feature-transport``), by ``release``'s
    rule (default: the default release; its ``facts.yaml`` adds architectures to the list)."""
    archs = list(architectures)
    if not archs:
        return Reservation(0, "no architectures in config.json")
    transformers = _flag_value(extra_args, "--model-impl") == "transformers"
    enable = "--enable-multimodal" in extra_args
    if not enable:
        if archs[0] in OFF_BY_DEFAULT and not transformers:
            return Reservation(0, f"{archs[0]}: SGLang turns multimodal off by default (--enable-multimodal turns it on)")
        if archs[0] == "MiMoV2ForCausalLM" and not both_vision_and_audio:
            return Reservation(0, "a MiMo-V2 without both vision_config and audio_config: multimodal off")
    if language_model_only:
        return Reservation(0, "config.json says language_model_only")
    from .releases import load_release

    known = MULTIMODAL_ARCHITECTURES | set(load_release(release).multimodal_architectures_added)
    arch = next((a for a in archs if a in known), None)
    if arch is not None:
        why = f"{arch} is a multimodal architecture"
    elif text_subconfig:
        why = "config.json nests its text model (a multimodal sub-config)"
    elif transformers and vision_or_audio:
        why = "--model-impl transformers with a vision or audio config"
    else:
        return Reservation(0, "a text-only model")
    mb, parts = VLM_CACHE_MB, f"SGLANG_VLM_CACHE_SIZE_MB {VLM_CACHE_MB}"
    transport = _flag_value(extra_args, "--mm-feature-transport")
    if transport in ("cuda_ipc", "cuda_vmm"):
        mb += FEATURE_CACHE_MB
        parts += f" + SGLANG_MM_FEATURE_CACHE_MB {FEATURE_CACHE_MB} (--mm-feature-transport {transport})"
    return Reservation(mb * 2**20, f"{why}: {parts} MiB out of the KV budget")
