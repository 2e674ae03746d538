"""Unloading really gives memory back: the process's resident memory falls by most of the model."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hotset_common.spec import ModelSpec
from hotset_worker import engine, memory
from hotset_worker.frameworks.base import WorkerContext

MiB = 2**20
# A BERT encoder whose embedding table alone is 420_000 x 128 float32 = 205 MiB.
BUILD_LARGE_MODEL = """
import sys, torch
from transformers import BertConfig, BertModel
from hotset_worker import samples
folder = sys.argv[1]
samples._save_tokenizer(__import__("pathlib").Path(folder))
torch.manual_seed(0)
config = BertConfig(vocab_size=420_000, hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=256, max_position_embeddings=128)
BertModel(config).save_pretrained(folder)
"""


@pytest.fixture(scope="module")
def large_model(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    """Made in a child process, so building it leaves nothing in this process's heap."""
    folder = tmp_path_factory.mktemp("large-model")
    subprocess.run([sys.executable, "-c", BUILD_LARGE_MODEL, str(folder)], check=True, timeout=300,
                   env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    return ModelSpec(id="large-encoder", framework="transformers", task="embedding", source=folder.as_uri())


def test_unloading_a_200mb_model_returns_most_of_it_to_the_os(
        large_model: ModelSpec, sample_specs: dict[str, ModelSpec]) -> None:
    # The first load of any model imports code and fills caches for good: pay that before measuring.
    warm_up = engine.create(sample_specs["mini-embed"], WorkerContext())
    warm_up.load()
    warm_up.predict("warm up")
    warm_up.unload()
    worker = engine.create(large_model, WorkerContext())
    memory.release()
    before_load = memory.process_rss_bytes()
    worker.load()
    assert worker.predict("a sentence to touch the weights")[0]["embedding"]
    size = worker.measured_bytes()
    loaded = memory.process_rss_bytes()
    assert size >= 200 * MiB
    assert loaded - before_load >= 0.7 * size, "the load itself should be visible in resident memory"

    worker.unload()
    del worker
    after_unload = memory.process_rss_bytes()
    returned = loaded - after_unload
    assert returned >= 0.7 * size, (
        f"unload returned {returned / MiB:.0f} MiB of a {size / MiB:.0f} MiB model "
        f"(rss {before_load / MiB:.0f} -> {loaded / MiB:.0f} -> {after_unload / MiB:.0f} MiB)"
    )


def test_release_returns_freed_heap_to_the_os() -> None:
    """Many mid-sized malloc'd blocks, freed: glibc keeps them until malloc_trim hands them back."""
    memory.release()
    before = memory.process_rss_bytes()
    blocks = [bytearray(2048) for _ in range(100_000)]  # ~200 MiB in malloc's heap, not mmap'd
    keep = bytearray(16)  # allocated last, so the heap top is pinned and plain free() cannot shrink it
    grown = memory.process_rss_bytes() - before
    del blocks
    memory.release()
    returned = before + grown - memory.process_rss_bytes()
    assert grown >= 150 * MiB
    assert returned >= 0.7 * grown, f"{returned / MiB:.0f} of {grown / MiB:.0f} MiB came back"
    del keep


def test_module_bytes_counts_parameters_and_buffers_once_each() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 1000, bias=False),
                                torch.nn.BatchNorm1d(1000))
    model[1].weight = model[0].weight  # tied, as language models tie input and output embeddings
    embedding = 1000 * 64 * 4
    batch_norm = (1000 * 2) * 4 + (1000 * 2) * 4 + 8  # weight, bias; running mean, var; num_batches_tracked
    assert memory.module_bytes(model) == embedding + batch_norm
