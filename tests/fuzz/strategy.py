"""What the differential fuzz draws: every profile key, every catalog flag a profile can put in
``runtime.extra_args``, and generated model folders.

- ``key_values()``: for each leaf key of ``Profile`` (pydantic model walk), the values drawn:
  a Literal's choices, ``true``/``false`` (and ``null`` where allowed), for numbers the
  shipped profiles' values, the default and the edges of the key's bounds, for sizes the
  shipped values halved and doubled; ``HAND`` adds odd values for the keys SGLang reads.
  Keys no value can be drawn for without a file or a secret are in ``NOT_DRAWN`` with why.
- ``extra_flags(release)``: each flag of the release's flag catalog
  (``escha_deploy/catalog/releases/*/flags.json``) that ``runtime.extra_args`` accepts (not a
  profile key's flag, not a secret, not the argv's own ``--model-path``/``--host``/``--port``),
  with its values from the catalog's type and choices (a switch alone; each choice; an int's
  default, 0, 1 and 64; a float's default and 0.5; a JSON value ``{}``/``[]``).
- ``RUNNER``: the model runner's attention-backend checks drawn together (about a third of the cases): the
  attention backend against the card's compute capability and the model's layer types (hybrid
  GDN or dense), which ``layers/attention/attention_registry.py`` judges jointly
  (``create_flashattention_v3_backend``, ``attn_backend_wrapper``); drawn one key at a time they
  rarely meet.
- ``folder_values``: what a generated model folder varies beyond the architecture keys:
  ``max_position_embeddings`` (short and long), ``rope_scaling`` (none, YaRN), attention heads.
- ``SPECULATIVE`` and ``DRAFT_KINDS``: what users combine for speculative decoding: the
  algorithms with SGLang's shape flags (``runtime.speculative``) and a draft folder
  (``model.draft``): the model's own (NEXTN on its MTP layers), a sibling MTP folder of the same
  architecture, or an EAGLE3 draft.
- ``flag_groups(release)``: the catalog flags SGLang's own code checks together, by what they
  are about (scheduling, the mamba strategy, speculation, the cache), for the cases that carry
  two to four of them.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from escha_deploy.sglang.arch import HYBRID_FIELDS
from escha_deploy.sglang.flagcheck import catalog_path
from escha_deploy.profile import Profile, key_flags, list_profiles, load_profile
from escha_deploy.utils.secretargs import extra_args_problems

#: Odd values for the keys SGLang reads, beyond what the type gives (edges SGLang refuses).
HAND: dict[str, tuple[str, ...]] = {
    "runtime.tp_size": ("1", "2", "3", "4"),
    "runtime.context_length": ("null", "4096", "28672", "131072", "262144", "300000"),
    "runtime.max_total_tokens": ("null", "8192", "28672", "210000"),
    "runtime.max_mamba_cache_size": ("null", "1", "10", "16"),
    "runtime.max_running_requests": ("null", "1", "2", "3", "64"),
    "runtime.page_size": ("null", "1", "8", "16", "64", "3"),
    "runtime.mem_fraction_static": ("null", "0.5", "0.8", "0.825", "0.95"),
    "runtime.chunked_prefill_size": ("null", "-1", "1024", "2048", "8192"),
    "runtime.cuda_graph_max_bs": ("null", "1", "4", "8", "256"),
    "hicache.hicache_ratio": ("auto", "1.5", "2"),
    "hardware.gpu_vram": ("12GiB", "16GiB", "24GiB", "80GiB"),
    "hardware.compute_capability": ('"8.9"', '"9.0"', '"10.0"', '"12.0"'),
    "hardware.gpu_name": ("GeForce RTX 5060 Ti", "GeForce RTX 4090", "H200"),
    "model.architecture.num_hidden_layers": ("2", "3", "48", "64"),
    "model.architecture.num_key_value_heads": ("1", "2", "3", "4", "8"),
    "model.architecture.head_dim": ("64", "96", "128", "256"),
    "model.architecture.full_attention_interval": ("null", "2", "4"),
    "runtime.needs": ("[]",),
    "container.gpus": ("all", "[0,1]", "[0]"),
}

#: The keys the model runner's attention-backend checks read together, and their values
#: (``attention_registry.py``: fa3's SM 8.x/9.x; a hybrid GDN model's backends on Blackwell).
RUNNER: dict[str, tuple[str, ...]] = {
    "runtime.attention_backend": ("triton", "flashinfer", "trtllm_mha", "fa3", "fa4", "torch_native", "flex_attention"),
    "hardware.compute_capability": HAND["hardware.compute_capability"],
    "model.architecture.full_attention_interval": ("null", "4"),
}

#: Values not drawn for a key, and why.
SKIPPED: dict[str, dict[str, str]] = {
    "model.quantization": {"mxfp4": "registered by layers/quantization/__init__.py only where is_cuda() holds at import: "
                                    "the CPU stand-in's answer (Unknown quantization method) is not a GPU's"},
    "hicache.hicache_size": {"1000000": "a million GB a rank: the host-memory rule refuses it on every box"},
    "runtime.kv_cache.dtype": {"fp4_e2m1": "0.5.19's --kv-cache-dtype lists it and its own code refuses it after the "
                                           "weights load (srt/mem_cache/kv_cache_dtype.py: configure_kv_cache_dtype); the "
                                           "profile refuses it with that reason (profile/models.py: REFUSED_KV_DTYPES), "
                                           "so no argv exists to show SGLang: a corpus case"},
    # every shipped profile's model is hybrid GDN: ModelArch refuses a linear_* field set to null
    # there (its mamba state is sized from them), and no config.json can show SGLang that model
    # (transformers' config class fills the missing field with its own default, another model)
    **{f"model.architecture.{k}": {"null": "a hybrid GDN model needs every linear_* field (ModelArch): no folder "
                                           "SGLang reads holds the model plan would be refusing"}
       for k in HYBRID_FIELDS},
}

#: Keys not drawn, and why (each would need a file, a secret or a second profile to mean anything).
NOT_DRAWN: dict[str, str] = {
    "name": "the profile's name: no SGLang input",
    "description": "free text: no SGLang input",
    "model.path": "the argv's --model-path is the generated folder",
    "model.host_dir": "set to the generated folder for every case",
    "model.checkpoint": "the published checkpoint `model pull` fetches (repo, revision, source): no SGLang input",
    "model.draft": "drawn as its own dimension with runtime.speculative (SPECULATIVE, DRAFT_KINDS): a generated "
                   "draft folder",
    "runtime.speculative": "drawn as its own dimension (SPECULATIVE), with model.draft",
    "runtime.extra_args": "drawn as its own dimension (extra_flags)",
    "runtime.sglang_version": "the release a case is split to",
    "runtime.base_image": "an image reference: no SGLang input",
    "container.image": "an image reference: no SGLang input",
    "container.api_key_file": "a secret's file",
    "container.hf_token_file": "a secret's file",
    "container.model_dir": "a host folder",
    "container.hf_cache_dir": "a host folder",
    "hicache.l3": "a union of L3 backends: drawn for linux-tp2-l3 only, as it ships",
    "runtime.min_total_tokens": "no SGLang input: the profile's own floor on the pool SGLang sizes; a refusal it "
                                "makes is by design, never one the SGLang side can judge (tests/planner/"
                                "test_speculative_bytes.py covers it)",
    "hicache.workload": "no SGLang input: the prefixes the plan's host-tier table asks about "
                        "(planner/reach.py; tests/planner/test_reach.py and the replay cover it)",
    "hicache.host_mamba_slots": "patch 0004's variable (ESCHA_HICACHE_HOST_MAMBA_SLOTS): the stock SGLang "
                                "the fuzz asks reads no such count (tests/runtime/test_host_mamba_slots.py "
                                "builds SGLang's MambaPoolHost with it)",
    "runtime.kv_cache.int2.mixed_windows": "the INT2 fork's variable (SGLANG_ENABLE_MIXED_KV_WINDOWS): the stock "
                                           "SGLang the fuzz asks stands in for int2 (OVERLAY_STAND_INS) and reads "
                                           "no such window (tests/planner/test_int2_mixed_window.py covers it)",
}


def _leaves(model: type[BaseModel], prefix: str = "") -> typing.Iterator[tuple[str, Any, Any]]:
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _leaves(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", ann, info


def _yaml(v: Any) -> str:
    """``v`` as ``--set`` reads it back (YAML): a string YAML would read as another type is quoted."""
    import yaml

    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return json.dumps(v).replace(" ", "")
    if isinstance(v, str) and yaml.safe_load(v) != v:
        return json.dumps(v)
    return str(v)


def _get(profile: Profile, key: str) -> Any:
    obj: Any = profile
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _args(ann: Any) -> tuple[Any, ...]:
    return typing.get_args(ann)


def _literals(ann: Any) -> list[Any]:
    out: list[Any] = []
    if typing.get_origin(ann) is Literal:
        return list(_args(ann))
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        for a in _args(ann):
            out += _literals(a)
    return out


def _optional(ann: Any) -> bool:
    return typing.get_origin(ann) in (typing.Union, types.UnionType) and type(None) in _args(ann)


def _is_size(info: Any) -> bool:
    """A size key (``units.parse_size``: ``12GiB``, never a bare number), also inside Optional."""
    return "parse_size" in repr(info.metadata) or "parse_size" in repr(info.annotation)


#: How far inside a strict float bound its edge is drawn (``mem_fraction_static`` ``gt=0, lt=1``:
#: 0.01 and 0.99); a strict int bound's edge is one step in.
FLOAT_STEP = 0.01


def _bounds(info: Any, step: float = 1) -> tuple[float | None, float | None]:
    """The key's smallest and largest values inside its bounds: a strict bound (``gt``, ``lt``)
    ``step`` inside (1 for an int, ``FLOAT_STEP`` for a float: ``gt=0`` is 0.01, not 1, and
    ``lt=1`` 0.99, not 0, each of which the key refuses)."""
    lo = hi = None
    for m in info.metadata:
        for name, attr in (("gt", "gt"), ("ge", "ge")):
            if getattr(m, attr, None) is not None:
                lo = getattr(m, attr) + (step if name == "gt" else 0)
        for attr in ("le", "lt"):
            if getattr(m, attr, None) is not None:
                hi = getattr(m, attr) - (step if attr == "lt" else 0)
    return lo, hi


@functools.cache
def key_values() -> dict[str, tuple[str, ...]]:
    """Every drawn profile key and its values (``--set`` spelling), in the model's order."""
    shipped = [load_profile(n) for n in list_profiles()]
    out: dict[str, tuple[str, ...]] = {}
    for key, ann, info in _leaves(Profile):
        if key in NOT_DRAWN:
            continue
        values: list[str] = [_yaml(_get(p, key)) for p in shipped]
        if not info.is_required():
            values.append(_yaml(info.get_default(call_default_factory=True)))
        lits = _literals(ann)
        values += [_yaml(v) for v in lits]
        base = ann
        if _optional(ann):
            values.append("null")
            base = next(a for a in _args(ann) if a is not type(None))
        size = _is_size(info)
        if base is bool:
            values += ["true", "false"]
        elif size:
            sizes = [int(_get(p, key)) for p in shipped if _get(p, key) is not None]
            values = ["null"] if _optional(ann) else []  # the shipped sizes, then halved and doubled
            values += [f"{b // 2**20}MiB" for b in sizes] + [f"{b // 2**21}MiB" for b in sizes] + [f"{b // 2**19}MiB" for b in sizes]
        elif typing.get_origin(base) is typing.Annotated or base in (int, float):
            kind = float if (base is float or float in _args(base)) else int
            lo, hi = _bounds(info, 1 if kind is int else FLOAT_STEP)
            if lo is not None:
                values.append(_yaml(kind(lo) if kind is int else round(max(float(lo), FLOAT_STEP), 6)))
            if hi is not None and hi < 10**7:
                values.append(_yaml(kind(hi) if kind is int else round(float(hi), 6)))
        flag = _flag_of(key)
        if flag and flag in _choices():
            values += [_yaml(c) for c in _choices()[flag]]
        values += HAND.get(key, ())
        out[key] = tuple(v for v in dict.fromkeys(values) if v != "None" and v not in SKIPPED.get(key, {}))
    return out


@functools.cache
def plausible_values(profile: str) -> dict[str, tuple[str, ...]]:
    """For each drawn key, the value ``profile`` ships with and the key's default: drawn twice
    as often as all its values together (``key_values``), so most cases stay near a shipped
    profile (another profile's card, weights or host pool on this profile's box is mostly a
    budget refusal, not a question for SGLang's argument checks)."""
    mine = load_profile(profile)
    fields = {k: info for k, _a, info in _leaves(Profile)}
    out = {}
    for key, values in key_values().items():
        info = fields[key]
        picks = [_get(mine, key)] + ([] if info.is_required() else [info.get_default(call_default_factory=True)])
        if _is_size(info):
            texts = [f"{int(v) // 2**20}MiB" if v is not None else "null" for v in picks]
        else:
            texts = [_yaml(v) for v in picks]
        out[key] = tuple(v for v in dict.fromkeys(texts) if v in values) or values
    return out


def _flag_of(key: str) -> str | None:
    flags = key_flags().get(key) or ()
    return flags[0] if flags else None


@functools.cache
def _choices() -> dict[str, list[Any]]:
    """The default release's catalog choices per flag."""
    from escha_deploy.sglang.releases import default_release

    return {a["flags"][0]: a["choices"] for a in _catalog(default_release()) if a.get("choices")}


def _catalog(release: str) -> list[dict]:
    return json.loads(Path(catalog_path(release)).read_text())["actions"]


#: The argv ``serve`` renders always carries these (each is the generated folder or a port).
_OWN = {"--model-path", "--host", "--port", "--help"}


@functools.cache
def extra_flags(release: str) -> tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]:
    """``(flag, its values as extra_args items)`` for each catalog flag ``runtime.extra_args``
    accepts, in the catalog's order."""
    owned = {f for flags in key_flags().values() for f in flags}
    out = []
    for a in _catalog(release):
        flag = a["flags"][0]
        if flag in _OWN or set(a["flags"]) & owned or a.get("dest") in {"help"}:
            continue
        if extra_args_problems([flag, "x"]) or extra_args_problems([f"{flag}=x"]):
            continue  # a secret flag: runtime.extra_args refuses it (secretargs.py)
        t, choices, default = a.get("type"), a.get("choices"), a.get("default")
        if a.get("nargs") == 0 or (t is None and a["action"] != "BooleanOptionalAction"):
            values: list[tuple[str, ...]] = [(flag,)]
        elif a["action"] == "BooleanOptionalAction":
            values = [(flag,), ("--no-" + flag[2:],)]
        elif choices:
            values = [(f"{flag}={c}",) for c in choices]
        elif t == "int" or t.endswith("human_readable_int"):
            values = [(f"{flag}={v}",) for v in dict.fromkeys([default, 0, 1, 64]) if isinstance(v, int)]
        elif t == "float":
            values = [(f"{flag}={v}",) for v in dict.fromkeys([default, 0.5]) if isinstance(v, (int, float))]
        elif t in ("json.loads",) or t.endswith("json_list_type"):
            values = [(f"{flag}={'[]' if 'list' in t else '{}'}",)]
        elif isinstance(default, str) and default:
            values = [(f"{flag}={default}",)]
        else:
            continue  # a free string with no default (a path, a URL, a name): nothing to draw from its type
        out.append((flag, tuple(values)))
    return tuple(out)


#: A generated model folder: config.json keys beyond the architecture (short and long contexts,
#: YaRN rope scaling, odd head counts).
folder_values: dict[str, tuple[Any, ...]] = {
    "folder.max_position_embeddings": (262144, 4096, 32768, 1048576),
    "folder.rope_scaling": (None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    "folder.num_attention_heads": (None, 24, 40, 7),
}


#: ``runtime.speculative`` values drawn (``--set`` spelling), each with the draft folders users pair
#: it with (``DRAFT_KINDS``): NEXTN and EAGLE on the model's own MTP layers or a sibling MTP folder
#: (or none: SGLang drafts from ``--model-path``), EAGLE3 with an EAGLE3 draft, STANDALONE with a
#: smaller model of the family, NGRAM without a draft; SGLang's shape left to it or given (top-k 1
#: chains, a tree), and a shape SGLang's ``_handle_eagle_family`` refuses.
SPECULATIVE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("{algorithm: NEXTN}", ("none", "own", "mtp")),
    ("{algorithm: NEXTN, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}", ("none", "own", "mtp")),
    ("{algorithm: NEXTN, num_steps: 1, eagle_topk: 1, num_draft_tokens: 2}", ("own",)),
    ("{algorithm: EAGLE, num_steps: 2, eagle_topk: 4, num_draft_tokens: 8}", ("own", "mtp")),
    ("{algorithm: EAGLE3}", ("eagle3",)),
    ("{algorithm: EAGLE3, num_steps: 5, eagle_topk: 1, num_draft_tokens: 6}", ("eagle3",)),
    ("{algorithm: STANDALONE}", ("mtp",)),
    ("{algorithm: NGRAM}", ("none",)),
    ("{algorithm: NEXTN, eagle_topk: 2}", ("own",)),
)
#: The draft folder a speculative case names in ``model.draft`` (``none``: no key).
DRAFT_KINDS: tuple[str, ...] = ("none", "own", "mtp", "eagle3")
#: Every (``runtime.speculative``, draft kind) pair drawn.
SPECULATIVE_PAIRS: tuple[tuple[str, str], ...] = tuple((v, k) for v, kinds in SPECULATIVE for k in kinds)

#: What a catalog flag is about, by words in its name: the flags SGLang's argument hooks and
#: sizing read together (``arg_groups/scheduling``/``overrides.py``, ``mamba_hook.py``,
#: ``speculative_hook.py``, ``kv_cache_hook.py``/``hicache_hook.py``).
FLAG_GROUPS: dict[str, tuple[str, ...]] = {
    "scheduling": ("schedule", "prefill", "running-requests", "overlap", "queue", "chunk", "batch"),
    "mamba strategy": ("mamba", "linear-attn", "replayssm", "gdn"),
    "speculative": ("speculative",),
    "cache": ("hicache", "radix", "kv-cache", "cache"),
}


@functools.cache
def flag_groups(release: str) -> dict[str, tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]]:
    """For each of ``FLAG_GROUPS``, its flags of ``extra_flags(release)`` (a flag may be in two)."""
    flags = extra_flags(release)
    return {g: tuple(f for f in flags if any(w in f[0] for w in words)) for g, words in FLAG_GROUPS.items()}
