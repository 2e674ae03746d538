"""The models and the request trace the memory-pressure benchmarks share.

Twelve small BERT sequence classifiers (hidden sizes 64/128/256, two layers,
0.5-7 MB of weights each), saved with ``save_pretrained`` like a user's model
and listed in a hotset model store, plus a seeded Zipf(1.0) sequence of
model ids. Built once under ``build/bench-models/`` (a second call reuses them),
in a child process so that building leaves nothing in the caller's heap.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO / "build" / "bench-models" / "bert12"
HIDDEN_SIZES = (64, 128, 256)
COUNT = 12
VERSION = "1"

_BUILD = """
import json, sys
from pathlib import Path
import torch
from transformers import BertConfig, BertForSequenceClassification
from hotset_worker import samples

root = Path(sys.argv[1])
for index, hidden in enumerate(json.loads(sys.argv[2])):
    folder = root / f"m{index + 1:03d}"
    if (folder / "model.safetensors").is_file():
        continue
    folder.mkdir(parents=True, exist_ok=True)
    vocab = samples._save_tokenizer(folder)
    torch.manual_seed(index)
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=4 * hidden, max_position_embeddings=128, num_labels=2,
                        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    BertForSequenceClassification(config).eval().save_pretrained(str(folder))
"""


def model_ids(count: int = COUNT) -> list[str]:
    return [f"m{index + 1:03d}" for index in range(count)]


def ensure_models(root: Path = DEFAULT_ROOT, count: int = COUNT) -> Path:
    """Build the models (if missing) and their store file; the store's path."""
    root.mkdir(parents=True, exist_ok=True)
    sizes = [HIDDEN_SIZES[index % len(HIDDEN_SIZES)] for index in range(count)]
    subprocess.run(
        [sys.executable, "-c", _BUILD, str(root), json.dumps(sizes)],
        check=True, timeout=600, env={"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "PATH": "/usr/bin:/bin"},
    )
    entries = []
    for model_id in model_ids(count):
        folder = root / model_id
        weights = (folder / "model.safetensors").stat().st_size
        entries.append({
            "id": model_id, "name": model_id, "type": "nlp", "framework": "transformers",
            "task": "text-classification", "version": VERSION, "source": folder.resolve().as_uri(),
            "memory": f"{(weights * 3 // 2) // 2**20 + 4}Mi",
        })
    store = root / "model-store.json"
    store.write_text(json.dumps({"models": entries}, indent=2) + "\n")
    return store


def zipf_trace(ids: list[str], requests: int, seed: int = 7, exponent: float = 1.0) -> list[str]:
    """`requests` model ids drawn from Zipf(`exponent`) over `ids` (first = most popular), seeded."""
    weights = [1.0 / (rank + 1) ** exponent for rank in range(len(ids))]
    return random.Random(seed).choices(ids, weights=weights, k=requests)


if __name__ == "__main__":
    print(ensure_models())
