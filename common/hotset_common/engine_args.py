"""A vLLM model's ``engineArgs``: which flags a ServedModel may pass, checked where it is admitted.

``engineArgs`` are vLLM's own flags written as a mapping (``max_model_len:
8192`` -> ``--max-model-len 8192``, ``true`` -> ``--flag``, ``false`` ->
``--no-flag``). Two things decide whether one is accepted, and both are known
before any engine starts:

- **the pinned vLLM knows it** (``vllm_flags.FLAGS``, generated from that
  vLLM's own argument parser by ``scripts/vllm_engine_args.py``): a flag it
  lacks makes the engine exit at once (vLLM 0.32 has no ``--swap-space``),
  which used to be found only when a pod loaded the model;
- **the project allows it** (``ALLOWED``): settings of how the engine
  computes and caches. Not what the worker sets itself (``SET_BY_WORKER``:
  model, names, host, port, key, static adapters), nor what would run code or
  open files and networks the worker does not control (``trust_remote_code``,
  ``middleware``, ``chat_template`` paths, ``ssl_*``, ``download_dir``...).

``problems`` lists everything wrong with a mapping, each naming its key: the
operator refuses such a ServedModel at admission (``Accepted=False``,
``spec.engineArgs.<key>: ...``) and a worker given one in a local model store
fails its load with the same words. ``to_flags`` renders an accepted mapping.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Mapping

from hotset_common.vllm_flags import FLAGS, VLLM_VERSION

# Settings a ServedModel may pass (keys as a ServedModel writes them: the flag's snake_case).
ALLOWED = frozenset({
    "gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "dtype",
    "quantization", "kv_cache_dtype", "block_size", "enforce_eager", "enable_prefix_caching",
    "enable_chunked_prefill", "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "seed",
    "tensor_parallel_size", "generation_config", "tokenizer_mode",
})
# What the worker passes to every engine itself (vllm_engines.py; adapters from spec.loraAdapters).
SET_BY_WORKER = frozenset({"model", "served_model_name", "host", "port", "api_key", "lora_modules"})

_HUMAN_INT = re.compile(r"\d+(?:\.\d+)?[kmgt]|\d+[KMGT]|\d+")


def _value_problem(key: str, value: Any, flag: Mapping[str, Any]) -> str | None:
    name = flag["flag"]
    if flag["kind"] == "negatable":
        return None if isinstance(value, bool) else f"{name} is on or off: true or false, not {value!r}"
    if flag["kind"] == "switch":
        if value is True:
            return None
        return f"{name} takes no value and has no --no- form: true, or leave it out (got {value!r})"
    if isinstance(value, bool):
        return f"{name} takes a value, not {str(value).lower()}"
    text = str(value).strip()
    choices = flag.get("choices")
    if choices and text not in choices:
        return f"{name} is one of {', '.join(choices)}, not {text[:40]!r}"
    kind = flag.get("type", "text")
    if kind == "int" and not (isinstance(value, int) or re.fullmatch(r"-?\d+", text)):
        return f"{name} takes a whole number, not {text[:40]!r}"
    if kind in ("human_int", "human_int_or_auto"):
        auto = kind == "human_int_or_auto" and (text.lower() == "auto" or text == "-1")
        if not auto and not (isinstance(value, int) or _HUMAN_INT.fullmatch(text)):
            return f"{name} takes a whole number such as 8192 or 8k{', or auto' if kind.endswith('auto') else ''}, " \
                   f"not {text[:40]!r}"
    if kind == "float":
        try:
            float(text)
        except ValueError:
            return f"{name} takes a number, not {text[:40]!r}"
    return None


def problems(engine_args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, what is wrong) for every key of `engine_args` that this vLLM or the project refuses."""
    found: list[tuple[str, str]] = []
    for key, value in sorted(engine_args.items(), key=lambda item: str(item[0])):
        key = str(key)
        flag = FLAGS.get(key.replace("-", "_"))
        if flag is None:
            close = difflib.get_close_matches(key.replace("-", "_"), sorted(ALLOWED), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            found.append((key, f"vLLM {VLLM_VERSION} has no --{key.replace('_', '-')}{hint}; an engine given it exits "
                               f"at once"))
            continue
        canonical = flag["flag"][2:].replace("-", "_")
        if canonical in SET_BY_WORKER:
            found.append((key, f"{flag['flag']} is set by the worker for every engine"
                               + (" (from spec.loraAdapters)" if canonical == "lora_modules" else "")))
        elif canonical not in ALLOWED:
            found.append((key, f"{flag['flag']} is a flag of vLLM {VLLM_VERSION} that hotset does not pass; "
                               f"accepted: {', '.join(sorted(ALLOWED))}"))
        elif key != canonical:
            found.append((key, f"write it as {canonical}"))
        elif (problem := _value_problem(key, value, flag)) is not None:
            found.append((key, problem))
    return found


def to_flags(engine_args: Mapping[str, Any]) -> list[str]:
    """``{"max_model_len": 2048, "enable_lora": True}`` as ``--enable-lora --max-model-len 2048``
    (sorted by key). ValueError naming the keys when ``problems`` finds any."""
    wrong = problems(engine_args)
    if wrong:
        raise ValueError("; ".join(f"engineArgs.{key}: {message}" for key, message in wrong))
    flags: list[str] = []
    for key, value in sorted(engine_args.items()):
        flag = FLAGS[key]["flag"]
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags
