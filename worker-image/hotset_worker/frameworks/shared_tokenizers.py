"""Tokenizers shared between copies whose tokenizer files are the same.

Many models of a team share one tokenizer (every fine-tune of one base model
does), and building one is a large part of a small model's load: transformers
converts a saved slow tokenizer into a fast one on every ``from_pretrained``.
So a loaded copy's tokenizer is looked up by a fingerprint of the files that
define it (their bytes, not their names or dates); copies with the same
fingerprint use one tokenizer object, and its lock (a fast tokenizer refuses
two threads at once). The last few tokenizers stay after their last copy goes
(``KEEP_RECENT``), so a model evicted and loaded again, or its sibling, finds
its tokenizer ready. A tokenizer is small next to the model it serves; it is
not counted in the model's bytes, as before.
"""
from __future__ import annotations

import collections
import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# Files a model folder may hold that do not define its tokenizer: weights and the model's own configs.
NOT_TOKENIZER = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".gguf", ".ckpt")
MODEL_ONLY = {"generation_config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}
KEEP_RECENT = 8


@dataclass(eq=False)
class SharedTokenizer:
    tokenizer: Any
    key: str
    lock: threading.Lock = field(default_factory=threading.Lock)


class TokenizerCache:
    """Live tokenizers by fingerprint (weakly held by the copies that use them) plus the last few."""

    def __init__(self, keep_recent: int = KEEP_RECENT) -> None:
        self._guard = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self._live: dict[str, tuple[SharedTokenizer, int]] = {}  # key -> (tokenizer, copies using it)
        self._recent: collections.OrderedDict[str, SharedTokenizer] = collections.OrderedDict()
        self._keep_recent = keep_recent
        self.built = 0  # tokenizers built (not found): tests and figures

    def acquire(self, folder: Path, build: Callable[[], Any]) -> SharedTokenizer:
        """The tokenizer of `folder`: a shared one with the same fingerprint, or `build()`'s."""
        key = fingerprint(folder)
        with self._guard:
            lock = self._building.setdefault(key, threading.Lock())
        with lock:  # two loads of siblings at once build it once
            with self._guard:
                found = self._take(key)
            if found is None:
                found = SharedTokenizer(build(), key)
                with self._guard:
                    self.built += 1
                    self._live[key] = (found, 1)
        return found

    def _take(self, key: str) -> SharedTokenizer | None:
        if key in self._live:
            shared, users = self._live[key]
            self._live[key] = (shared, users + 1)
            return shared
        shared = self._recent.pop(key, None)
        if shared is not None:
            self._live[key] = (shared, 1)
        return shared

    def release(self, shared: SharedTokenizer) -> None:
        """A copy that used `shared` is gone; the last user leaves it among the recent ones."""
        with self._guard:
            entry = self._live.get(shared.key)
            if entry is None or entry[0] is not shared:
                return
            if entry[1] > 1:
                self._live[shared.key] = (shared, entry[1] - 1)
                return
            del self._live[shared.key]
            self._recent[shared.key] = shared
            while len(self._recent) > self._keep_recent:
                self._recent.popitem(last=False)

    def live(self) -> int:
        with self._guard:
            return len(self._live)


def fingerprint(folder: Path) -> str:
    """A digest of the bytes of every file in `folder` that may define its tokenizer. The model's
    config.json counts only when tokenizer_config.json does not name the tokenizer class
    (transformers then reads the class from the model's config)."""
    digest = hashlib.sha256()
    names = sorted(path.name for path in folder.iterdir() if path.is_file())
    config_matters = True
    if "tokenizer_config.json" in names:
        try:
            config_matters = not json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
        except (OSError, ValueError, AttributeError):
            config_matters = True
    for name in names:
        if name.endswith(NOT_TOKENIZER) or name in MODEL_ONLY or (name == "config.json" and not config_matters):
            continue
        digest.update(name.encode() + b"\0")
        digest.update((folder / name).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


TOKENIZERS = TokenizerCache()
