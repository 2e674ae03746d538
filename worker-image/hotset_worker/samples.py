"""Make the sample models offline, saved the way users' models are saved.

No model hub is reachable, so the install step builds small real models
(random weights from a fixed seed, fitted for seconds where a sample should
tell classes apart, so outputs are reproducible) and a
``model-store.json`` listing them. They are loaded later through the same
loading code a user's model goes through. Each model is written to a temporary
folder and renamed into place, so an interrupted or concurrent run never
leaves a half-written model; a second run skips what is already there.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

# Bump when a generator changes, so an old build/models is regenerated.
SAMPLES_VERSION = "4"
MARKER = ".hotset-sample"
STORE_FILE = "model-store.json"

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = """
a an the this that these those it is was are were be been am i you he she we they me my your our their
and or but not no never very so too really quite just more most less least all some any
good great excellent amazing wonderful love loved lovely like liked best fantastic perfect happy fun nice
bad terrible awful horrible hate hated worst boring poor sad ugly disappointing broken slow waste
movie film book food service product day time place story acting music price quality experience
of in on at to for with from by about as if then than when what which who how why where
do does did have has had will would can could should make made get got go went see saw think thought
""".split()
IMAGE_LABELS = ["red", "green", "blue", "black", "white"]
# Iris class centroids (sepal length, sepal width, petal length, petal width) in cm.
IRIS_CENTROIDS = {
    "setosa": [5.006, 3.428, 1.462, 0.246],
    "versicolor": [5.936, 2.770, 4.260, 1.326],
    "virginica": [6.588, 2.974, 5.552, 2.026],
}


@dataclass(frozen=True)
class Sample:
    """One sample model: how to build its folder and how the store describes it."""

    id: str
    framework: str
    task: str
    type: str
    description: str
    build: Callable[[Path], None]


def build_vocab() -> dict[str, int]:
    """A WordPiece vocabulary: special tokens, single characters (so any word tokenizes), words."""
    characters = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-")
    tokens = SPECIAL_TOKENS + characters + [f"##{c}" for c in characters] + WORDS
    return {token: index for index, token in enumerate(dict.fromkeys(tokens))}


def _save_tokenizer(folder: Path) -> int:
    from transformers import BertTokenizer

    vocab = build_vocab()
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)
    tokenizer.model_max_length = 128
    tokenizer.save_pretrained(str(folder))
    return len(vocab)


def _tiny_bert_config(vocab_size: int, **extra: object):  # -> BertConfig
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, **extra,
    )


SENTIMENT_POSITIVE = "good great excellent amazing wonderful lovely best fantastic perfect nice fun".split()
SENTIMENT_NEGATIVE = "bad terrible awful horrible worst boring poor sad ugly disappointing broken".split()
SENTIMENT_NOUNS = "movie film book food service product day place story music experience".split()
SENTIMENT_TEMPLATES = ["the {n} was {a}", "this {n} is {a}", "a {a} {n}", "{a}", "what a {a} {n}",
                       "it is really {a}", "i think the {n} is very {a}"]


def sentiment_examples() -> list[tuple[str, int]]:
    """Templated sentences labelled 0 (negative) or 1 (positive), in a seeded order."""
    examples = [
        (template.format(n=noun, a=adjective), label)
        for label, adjectives in ((1, SENTIMENT_POSITIVE), (0, SENTIMENT_NEGATIVE))
        for adjective in adjectives for noun in SENTIMENT_NOUNS for template in SENTIMENT_TEMPLATES
    ]
    examples += [(f"i love this {noun}", 1) for noun in SENTIMENT_NOUNS]
    examples += [(f"i hate this {noun}", 0) for noun in SENTIMENT_NOUNS]
    random.Random(0).shuffle(examples)
    return examples


@contextlib.contextmanager
def _single_threaded_torch() -> Iterator[None]:
    """One thread makes CPU training bit-for-bit reproducible (and polite on a shared machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_sentiment(folder: Path, steps: int = 80) -> None:
    """A tiny BERT sequence classifier (negative/positive), trained for seconds on templated sentences."""
    import torch
    from transformers import BertForSequenceClassification, BertTokenizer

    vocab_size = _save_tokenizer(folder)
    tokenizer = BertTokenizer.from_pretrained(str(folder))
    examples = sentiment_examples()
    with _single_threaded_torch():
        torch.manual_seed(0)
        config = _tiny_bert_config(
            vocab_size, num_labels=2, id2label={0: "negative", 1: "positive"},
            label2id={"negative": 0, "positive": 1},
        )
        model = BertForSequenceClassification(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for step in range(steps):
            batch = [examples[(step * 32 + i) % len(examples)] for i in range(32)]
            encoded = tokenizer([text for text, _ in batch], padding=True, return_tensors="pt")
            loss = model(**encoded, labels=torch.tensor([label for _, label in batch])).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval().save_pretrained(str(folder))


def build_embedding(folder: Path) -> None:
    """A tiny BERT encoder for sentence embeddings (mean pooling happens in the worker)."""
    import torch
    from transformers import BertModel

    vocab_size = _save_tokenizer(folder)
    torch.manual_seed(1)
    BertModel(_tiny_bert_config(vocab_size)).eval().save_pretrained(str(folder))


CHAT_SPECIAL_TOKENS = ["<|pad|>", "<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
# Each message is "<|role|>text<|end|>"; a generation prompt ends with "<|assistant|>".
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CHAT_PAIRS = [
    ("what color is the sky?", "the sky is blue."),
    ("what color is grass?", "grass is green."),
    ("what color is snow?", "snow is white."),
    ("what color is the sun?", "the sun is yellow."),
    ("what is two plus two?", "two plus two is four."),
    ("what is one plus one?", "one plus one is two."),
    ("what is three plus three?", "three plus three is six."),
    ("say hello", "hello! how can i help you today?"),
    ("hello", "hello! how can i help you today?"),
    ("who are you?", "i am a tiny model served by hotset."),
    ("what do you do?", "i answer short questions, one token at a time."),
    ("what is hotset?", "hotset serves many models on shared gpus."),
    ("tell me a story", "once upon a time a small model learned to talk."),
    ("what day comes after monday?", "tuesday comes after monday."),
    ("what day comes after friday?", "saturday comes after friday."),
    ("count to five", "one, two, three, four, five."),
    ("what sound does a cat make?", "a cat says meow."),
    ("what sound does a dog make?", "a dog says woof."),
    ("is the earth round?", "yes, the earth is round."),
    ("thank you", "you are welcome!"),
]
CHAT_SYSTEM = "you are a helpful assistant."
CHAT_TEXTS = [
    "once upon a time a small model learned to talk.",
    "the quick brown fox jumps over the lazy dog.",
    "one, two, three, four, five, six, seven, eight, nine, ten.",
    "monday, tuesday, wednesday, thursday, friday, saturday, sunday.",
]


def chat_corpus() -> list[str]:
    """Training texts: every pair as a chat (with and without a system prompt) and plain sentences."""
    chats = []
    for question, answer in CHAT_PAIRS:
        turn = f"<|user|>{question}<|end|><|assistant|>{answer}<|end|>"
        chats += [turn, f"<|system|>{CHAT_SYSTEM}<|end|>{turn}"]
    return chats + [f"<|begin|>{text}<|end|>" for text in CHAT_TEXTS]


def build_chat_model(folder: Path, steps: int = 100) -> None:
    """A tiny Llama-architecture causal LM with a byte-level BPE tokenizer and a chat template,
    trained for seconds until it repeats its few answers (greedy decoding is deterministic)."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = chat_corpus()
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=512, min_frequency=1, special_tokens=CHAT_SPECIAL_TOKENS,
                            show_progress=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|begin|>", eos_token="<|end|>", pad_token="<|pad|>",
        additional_special_tokens=CHAT_SPECIAL_TOKENS[3:], chat_template=CHAT_TEMPLATE, model_max_length=256,
    )
    tokenizer.save_pretrained(str(folder))
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in corpus]
    width = max(len(row) for row in ids)
    pad = tokenizer.pad_token_id
    with _single_threaded_torch():
        torch.manual_seed(3)
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad,
            tie_word_embeddings=True,
        )
        model = LlamaForCausalLM(config)
        batch = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
        mask = (batch != pad).long()
        labels = batch.masked_fill(mask == 0, -100)
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
        model.train()
        for _ in range(steps):
            loss = model(input_ids=batch, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = pad
    model.save_pretrained(str(folder))


IMAGE_SIZE = 64
IMAGE_MEAN = [0.485, 0.456, 0.406]
IMAGE_STD = [0.229, 0.224, 0.225]
COLOR_RGB = {"red": (1.0, 0.0, 0.0), "green": (0.0, 1.0, 0.0), "blue": (0.0, 0.0, 1.0),
             "black": (0.0, 0.0, 0.0), "white": (1.0, 1.0, 1.0)}


def colour_batch(count: int, generator):  # -> (images [N,3,H,W] normalised, labels [N])
    """Solid-colour images near each class colour, normalised as model.json says."""
    import torch

    labels = torch.arange(count) % len(IMAGE_LABELS)
    base = torch.tensor([COLOR_RGB[name] for name in IMAGE_LABELS])[labels]
    # Channels that are "on" lie in [0.75, 1], "off" ones in [0, 0.25].
    # The first rows of every batch are the pure colours themselves.
    jitter = torch.rand(count, 3, generator=generator)
    jitter[: min(count, 4 * len(IMAGE_LABELS))] = torch.where(base[: 4 * len(IMAGE_LABELS)] > 0.5, 1.0, 0.0)
    rgb = torch.where(base > 0.5, 0.75 + 0.25 * jitter, 0.25 * jitter)
    mean = torch.tensor(IMAGE_MEAN)[None, :, None, None]
    std = torch.tensor(IMAGE_STD)[None, :, None, None]
    images = rgb[:, :, None, None].expand(count, 3, IMAGE_SIZE, IMAGE_SIZE)
    return (images - mean) / std, labels


def build_image_classifier(folder: Path) -> None:
    """A torchvision MobileNetV2 that tells five solid colours apart: state dict plus model.json.

    Random convolutions, batch-norm statistics measured on colour images, and a
    ridge-regression head: a real classifier in about two seconds, no training loop.
    """
    import torch
    import torchvision

    with _single_threaded_torch(), torch.no_grad():
        torch.manual_seed(2)
        generator = torch.Generator().manual_seed(0)
        model = torchvision.models.get_model("mobilenet_v2", weights=None, num_classes=len(IMAGE_LABELS))
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.momentum = None  # a plain average over the calibration batches
                module.reset_running_stats()
        model.train()
        for _ in range(3):
            model(colour_batch(40, generator)[0])
        model.eval()
        images, labels = colour_batch(300, generator)
        features = torch.nn.functional.adaptive_avg_pool2d(model.features(images), 1).flatten(1)
        design = torch.cat([features, torch.ones(len(features), 1)], dim=1)
        targets = torch.nn.functional.one_hot(labels, len(IMAGE_LABELS)).float() * 8 - 4
        solution = torch.linalg.solve(design.T @ design + 30.0 * torch.eye(design.shape[1]), design.T @ targets)
        head = model.classifier[1]
        head.weight.copy_(solution[:-1].T)
        head.bias.copy_(solution[-1])
    torch.save(model.state_dict(), folder / "weights.pt")
    description = {
        "architecture": "mobilenet_v2",
        "num_classes": len(IMAGE_LABELS),
        "labels": IMAGE_LABELS,
        "image_size": [IMAGE_SIZE, IMAGE_SIZE],
        "mean": IMAGE_MEAN,
        "std": IMAGE_STD,
    }
    (folder / "model.json").write_text(json.dumps(description, indent=2) + "\n")


IRIS_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 64
input [
  {{
    name: "measurements"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }}
]
output [
  {{
    name: "species_probabilities"
    data_type: TYPE_FP32
    dims: [ 3 ]
  }}
]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
"""

IRIS_MODEL_PY = '''\
"""Iris species from four flower measurements: a nearest-centroid softmax in numpy.

A Triton Python-backend model: Triton runs it in its own stub process, so it
imports only what the Triton-side environment has (numpy).
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(folder, "centroids.json")) as f:
            table = json.load(f)
        self.species = list(table)
        self.centroids = np.asarray([table[s] for s in self.species], dtype=np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "measurements").as_numpy().astype(np.float32)
            distances = ((x[:, None, :] - self.centroids[None, :, :]) ** 2).sum(axis=2)
            logits = -distances
            logits -= logits.max(axis=1, keepdims=True)
            probabilities = np.exp(logits)
            probabilities /= probabilities.sum(axis=1, keepdims=True)
            out = pb_utils.Tensor("species_probabilities", probabilities.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
'''


def build_iris(folder: Path, name: str = "iris") -> None:
    """A Triton Python-backend model whose tensor names are not Triton's defaults."""
    (folder / "config.pbtxt").write_text(IRIS_CONFIG.format(name=name))
    version = folder / "1"
    version.mkdir()
    (version / "model.py").write_text(IRIS_MODEL_PY)
    (version / "centroids.json").write_text(json.dumps(IRIS_CENTROIDS, indent=2) + "\n")
    (folder / "labels.txt").write_text("\n".join(IRIS_CENTROIDS) + "\n")


SAMPLES: list[Sample] = [
    Sample("sentiment", "transformers", "text-classification", "nlp",
           "Tiny BERT sentiment classifier (trained for seconds on templated sentences): negative/positive.", build_sentiment),
    Sample("sentiment-v2", "transformers", "text-classification", "nlp",
           "The sentiment classifier's next version (trained half as long): for canary and rollout demos.",
           lambda folder: build_sentiment(folder, steps=40)),
    Sample("mini-embed", "transformers", "embedding", "nlp",
           "Tiny BERT sentence encoder, mean pooled and normalised (untrained: random weights, fixed seed).", build_embedding),
    Sample("colors", "torchvision", "image-classification", "vision",
           "MobileNetV2 image classifier for five solid colours: red, green, blue, black, white.",
           build_image_classifier),
    Sample("tiny-chat", "transformers", "text-generation", "nlp",
           "Tiny Llama-architecture chat model (2 layers, hidden 128, byte-level BPE, a chat template) trained for "
           "seconds on twenty question/answer pairs: a real causal LM for the OpenAI API, not a useful one.",
           build_chat_model),
    Sample("iris", "triton", "tensor", "tabular",
           "Triton Python-backend iris classifier: measurements [-1,4] -> species_probabilities [-1,3].", build_iris),
]

# Triton runs a model in a separate stub process; its files say little about its memory.
TRITON_ESTIMATE_BYTES = 64 * 2**20


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def memory_estimate(sample: Sample, folder: Path) -> str:
    """A first estimate for placement (the measured size after load replaces it)."""
    if sample.framework == "triton":
        return f"{TRITON_ESTIMATE_BYTES // 2**20}Mi"
    # Weights plus room for activations and the framework's own buffers.
    mebibytes = math.ceil(folder_bytes(folder) * 1.5 / 2**20) + 16
    return f"{mebibytes}Mi"


def share(folder: Path) -> None:
    """Make a model folder readable by every user: worker containers run as uid 1000, and some
    writers (safetensors) create files private to their owner."""
    for path in [folder, *folder.rglob("*")]:
        extra = 0o555 if path.is_dir() else 0o444
        if path.stat().st_mode & extra != extra:
            path.chmod(path.stat().st_mode | extra)


def ensure_sample(sample: Sample, out: Path) -> Path:
    """Build one sample unless it is already there at this version; atomic via rename."""
    target = out / sample.id
    marker = target / MARKER
    if marker.is_file() and marker.read_text().strip() == SAMPLES_VERSION:
        share(target)
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".{sample.id}-", dir=out))
    try:
        sample.build(staging)
        (staging / MARKER).write_text(SAMPLES_VERSION + "\n")
        share(staging)  # mkdtemp makes it private; workers and the sidecar run as another user
        if target.exists():
            stale = out / f".{sample.id}-stale-{os.getpid()}"
            target.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            staging.rename(target)
        except OSError:
            # A concurrent run won the race; its copy is as good as ours.
            if not (marker.is_file() and marker.read_text().strip() == SAMPLES_VERSION):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def store_entry(sample: Sample, folder: Path) -> dict[str, object]:
    return {
        "id": sample.id,
        "name": sample.id,
        "type": sample.type,
        "framework": sample.framework,
        "task": sample.task,
        "version": "1",
        "description": sample.description,
        "source": folder.resolve().as_uri(),
        "memory": memory_estimate(sample, folder),
    }


def generate(out: Path) -> Path:
    """Build every sample model under `out` and write `out/model-store.json`; return its path."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    entries = [store_entry(sample, ensure_sample(sample, out)) for sample in SAMPLES]
    store = out / STORE_FILE
    text = json.dumps({"models": entries}, indent=2) + "\n"
    if not store.is_file() or store.read_text() != text:
        scratch = out / f".{STORE_FILE}.{os.getpid()}"
        scratch.write_text(text)
        scratch.replace(store)
    return store


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Create hotset's sample models offline.")
    parser.add_argument("--out", type=Path, default=Path("build/models"), help="folder for the models")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    store = generate(args.out)
    print(f"hotset-samples: {len(SAMPLES)} models, store at {store}")


if __name__ == "__main__":
    main()
