"""Profiles: typed, frozen descriptions of a box, a model and how to serve it.

- ``profile.models``: the section models and ``Profile``; each key's SGLang flag is
  ``SGLangFlag`` field metadata, the one place it is spelled (``key_flag``/``key_env`` look it
  up by dotted key);
- ``profile.loading``: ``load_profile`` (YAML with positions, ``extends:``, ``--set``, one
  validation, error lines naming file:line);
- ``profile.rules``: every rule that needs the profile alone, in one list (``RULES``).

The YAML error formatter is ``yamlpos.format_validation_errors``. Everything a caller needs is
importable from ``escha_deploy.profile``.
"""

from __future__ import annotations

from .loading import (
    PROFILE_FILE_SUFFIXES,
    apply_override,
    copy_profile,
    deep_merge,
    key_source,
    list_profiles,
    load_profile,
    load_raw,
    names_a_file,
    profile_name,
    resolve_profile_path,
    shipped_profile_file,
)
from .models import (
    DEFAULT_CUDA_CONTEXT,
    DEFAULT_MAX_RATIO,
    DEFAULT_OS_RESERVE,
    DEFAULT_PAGE_CACHE_FLOOR,
    DEFAULT_RATIO_STEP,
    DEFAULT_RECOMMEND_HEADROOM,
    DEFAULT_SERVER_PROCESS_PER_RANK,
    DEFAULT_WSL2_HIDDEN_VRAM,
    IMAGE_REF,
    MAX_GPUS,
    MAX_RATIO,
    MAX_SECONDS,
    MAX_TOKENS,
    MIN_RATIO_STEP,
    NAME_PATTERN,
    NAME_RULE,
    Container,
    FLAT_L3_KEYS,
    L3,
    EschaModel,
    Hardware,
    L3File,
    L3Mooncake,
    L3Other,
    HiCache,
    Int2Options,
    KvCache,
    KvDtype,
    ModelSection,
    Number,
    Profile,
    Runtime,
    Safety,
    SGLangFlag,
    Size,
    is_size_field,
    key_env,
    key_flag,
    key_metadata,
    l3_from_flat,
    normalize_kv_dtype,
    profile_json_schema,
    profile_to_data,
    sglang_flag,
)
from .rules import (
    RULES,
    Problem,
    Rule,
    cross_field_problems,
    extra_args_duplicating_keys,
    key_flags,
    profile_only_problems,
    profile_only_warnings,
    sglang_late_refusals,
)

__all__ = [
    "PROFILE_FILE_SUFFIXES", "apply_override", "copy_profile", "deep_merge", "key_source", "list_profiles", "load_profile",
    "load_raw", "names_a_file", "profile_name", "resolve_profile_path", "shipped_profile_file",
    "DEFAULT_CUDA_CONTEXT", "DEFAULT_MAX_RATIO", "DEFAULT_OS_RESERVE", "DEFAULT_PAGE_CACHE_FLOOR",
    "DEFAULT_RATIO_STEP", "DEFAULT_RECOMMEND_HEADROOM", "DEFAULT_SERVER_PROCESS_PER_RANK",
    "DEFAULT_WSL2_HIDDEN_VRAM", "IMAGE_REF", "MAX_GPUS", "MAX_RATIO", "MAX_SECONDS", "MAX_TOKENS",
    "MIN_RATIO_STEP", "NAME_PATTERN", "NAME_RULE", "Container", "FLAT_L3_KEYS", "L3", "L3File", "L3Mooncake", "L3Other", "l3_from_flat", "EschaModel", "Hardware", "HiCache",
    "Int2Options", "KvCache", "KvDtype", "ModelSection", "Number", "Profile", "Runtime", "Safety", "SGLangFlag", "Size",
    "is_size_field", "key_env", "key_flag", "key_metadata", "normalize_kv_dtype", "profile_json_schema", "profile_to_data", "sglang_flag",
    "RULES", "Problem", "Rule", "cross_field_problems", "extra_args_duplicating_keys", "key_flags",
    "profile_only_problems", "profile_only_warnings", "sglang_late_refusals",
]
