"""torchvision image classifiers: an architecture name plus a saved state dict.

The source folder holds ``model.json`` (architecture for
``torchvision.models.get_model``, num_classes, labels, image_size [H, W],
mean, std) and ``weights.pt`` (the state dict). Images arrive as bytes
(base64 in JSON, raw in OIP ``BYTES``) and are decoded here, never read from a
server-side path. Tensor input is taken as already preprocessed (resized and
normalised), the way Triton and KServe treat tensors. OIP metadata lists only
the canonical ``input`` tensor; ``image`` (encoded images) is an extension
infer takes instead of it.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hotset_common import errors
from hotset_worker import engine, memory
from hotset_worker.frameworks import sources, torch_common
from hotset_worker.frameworks.base import FrameworkWorker, Rows, RowsResult, TensorSpec

DESCRIPTION_FILE = "model.json"
WEIGHTS_FILE = "weights.pt"
TENSOR_INPUT = "input"
IMAGE_INPUT = "image"
PROBABILITIES_OUTPUT = "probabilities"
# A small compressed file can decode to gigabytes (a "decompression bomb"): refuse before decoding.
MAX_IMAGE_PIXELS = 40_000_000
# All the images of one request together (each decode costs CPU in proportion to its pixels):
# without it one request could ask for 256 images of 40 Mpx, minutes of decoding.
MAX_REQUEST_PIXELS = 64_000_000


@dataclass(frozen=True)
class ImageModelDescription:
    """What model.json says about the network and its expected input."""

    architecture: str
    labels: list[str]
    height: int
    width: int
    mean: list[float]
    std: list[float]

    @classmethod
    def read(cls, path: Path) -> "ImageModelDescription":
        try:
            raw = json.loads(path.read_text())
            labels = [str(label) for label in raw["labels"]]
            num_classes = int(raw.get("num_classes", len(labels)))
            height, width = (int(v) for v in raw.get("image_size", [224, 224]))
            description = cls(
                architecture=str(raw["architecture"]), labels=labels, height=height, width=width,
                mean=[float(v) for v in raw.get("mean", [0.485, 0.456, 0.406])],
                std=[float(v) for v in raw.get("std", [0.229, 0.224, 0.225])],
            )
        except FileNotFoundError as exc:
            raise errors.ModelLoadFailed(f"{path} is missing") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.ModelLoadFailed(f"{path} is not a valid model description: {type(exc).__name__}: {exc}") from exc
        if num_classes != len(labels):
            raise errors.ModelLoadFailed(f"{path}: num_classes {num_classes} but {len(labels)} labels")
        if len(description.mean) != 3 or len(description.std) != 3:
            raise errors.ModelLoadFailed(f"{path}: mean and std need three values (RGB)")
        return description


@engine.register("torchvision")
class TorchvisionWorker(FrameworkWorker):
    """An image classifier: encoded images or preprocessed tensors in, label probabilities out."""

    def __init__(self, spec: Any, context: Any) -> None:
        super().__init__(spec, context)
        self._model: Any = None
        self._description: ImageModelDescription | None = None
        self._device: Any = None
        self._bytes = 0

    @classmethod
    def declared_tensors(cls, spec: Any, context: Any) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
        """From model.json: the image size and the labels."""
        folder = sources.cached_folder(spec, context)
        if folder is None:
            return None  # a remote source not fetched yet: known once loaded
        described = cls(spec, context)
        described._description = ImageModelDescription.read(folder / DESCRIPTION_FILE)
        return described.inputs(), described.outputs()

    @classmethod
    def prepare(cls) -> None:
        """Import torch, torchvision and PIL at pod start, not in the first load."""
        import PIL.Image  # noqa: F401
        import torch  # noqa: F401
        import torchvision  # noqa: F401

    def load(self) -> None:
        folder = sources.folder(self.spec, self.context)
        description = ImageModelDescription.read(folder / DESCRIPTION_FILE)
        import torch
        import torchvision

        self._device = torch_common.torch_device(self.context.device)
        weights = folder / WEIGHTS_FILE
        if not weights.is_file():
            raise errors.ModelLoadFailed(f"model {self.spec.id!r}: {weights} is missing")
        try:
            # Built on the meta device: no random initialisation of weights that the
            # state dict replaces anyway (less CPU, and less GIL held, during a load).
            with torch.device("meta"):
                model = torchvision.models.get_model(description.architecture, weights=None,
                                                     num_classes=len(description.labels))
        except ValueError as exc:
            raise errors.ModelLoadFailed(
                f"model {self.spec.id!r}: unknown torchvision architecture {description.architecture!r}: {exc}"
            ) from exc
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
            model.load_state_dict(state, assign=True)
        except Exception as exc:  # pickle, zip and shape errors all mean "these weights do not fit"
            raise errors.ModelLoadFailed(
                f"model {self.spec.id!r}: cannot load {weights}: {type(exc).__name__}: {str(exc)[:500]}"
            ) from exc
        del state
        if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
            # A non-persistent buffer is not in the state dict: build it the ordinary way.
            model = torchvision.models.get_model(description.architecture, weights=None,
                                                 num_classes=len(description.labels))
            model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        self._model = model.to(self._device).eval()
        self._description = description
        self._bytes = memory.module_bytes(self._model)

    @property
    def description(self) -> ImageModelDescription:
        if self._description is None or self._model is None:
            raise errors.BackendUnavailable(f"model {self.spec.id!r} is not loaded")
        return self._description

    def _checked(self, batch: np.ndarray) -> np.ndarray:
        """`batch` as a float32 [N, 3, H, W] array of this model's image size; BadInput otherwise."""
        description = self.description
        expected = (3, description.height, description.width)
        if batch.ndim != 4 or tuple(batch.shape[1:]) != expected:
            raise errors.BadInput(
                f"image tensor must have shape [N, 3, {description.height}, {description.width}] "
                f"(or [3, {description.height}, {description.width}]), got {list(batch.shape)}"
            )
        torch_common.check_batch_size(batch.shape[0], "image batch")
        return np.ascontiguousarray(batch, dtype=np.float32)

    def _classify(self, batch: np.ndarray) -> np.ndarray:
        """Probabilities [N, C] for a checked float batch [N, 3, H, W]."""
        import torch

        tensor = torch.from_numpy(batch).to(self._device)
        with torch.inference_mode():
            probabilities = torch.softmax(self._model(tensor).float(), dim=-1)
        return probabilities.cpu().numpy().astype(np.float32)

    def _preprocess(self, encoded: bytes) -> np.ndarray:
        """Decode, convert to RGB, resize and normalise one image -> [3, H, W] float32."""
        from PIL import Image, UnidentifiedImageError

        description = self.description
        try:
            with Image.open(io.BytesIO(encoded)) as image:  # reads the header only
                # JPEG decodes straight at 1/2, 1/4 or 1/8 scale when that is still larger than the target.
                image.draft("RGB", (description.width, description.height))
                rgb = image.convert("RGB").resize((description.width, description.height), Image.Resampling.BILINEAR)
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
            raise errors.BadInput(f"cannot decode image ({len(encoded)} bytes): {exc}") from exc
        pixels = np.asarray(rgb, dtype=np.float32) / 255.0
        pixels = (pixels - np.asarray(description.mean, dtype=np.float32)) / np.asarray(description.std, dtype=np.float32)
        return pixels.transpose(2, 0, 1)

    def _images_to_batch(self, images: list[bytes]) -> np.ndarray:
        torch_common.check_batch_size(len(images), "image list")
        check_pixels(images)  # every header first: refuse before decoding any of them
        return np.stack([self._preprocess(image) for image in images])

    # ----- dynamic batching: every request goes through forward() -----------------------------

    def batchable(self) -> bool:
        return True

    def rows_for_predict(self, input_data: Any) -> Rows:
        """Base64 image (or a list of them), or a preprocessed nested list [3,H,W] / [N,3,H,W]."""
        if isinstance(input_data, str):
            batch = self._images_to_batch([_from_base64(input_data)])
        elif isinstance(input_data, list) and input_data and all(isinstance(i, str) for i in input_data):
            batch = self._images_to_batch([_from_base64(item) for item in input_data])
        elif isinstance(input_data, list) and input_data:
            batch = _tensor_from_json(input_data)
        else:
            raise errors.BadInput(
                "input_data must be a base64-encoded image, a list of them, or a tensor [3,H,W] / [N,3,H,W]; "
                f"got {type(input_data).__name__ if input_data != [] else 'an empty list'}"
            )
        labels = self.description.labels
        batch = self._checked(batch)
        return Rows(batch.shape[0], batch, lambda r: torch_common.labelled_rows(r.values, labels))

    def rows_for_infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> Rows:
        if set(inputs) == {TENSOR_INPUT}:
            tensor = inputs[TENSOR_INPUT]
            if tensor.dtype.kind != "f":
                raise errors.BadInput(f"input {TENSOR_INPUT!r} must be FP32, got {tensor.dtype}")
            batch = tensor
        elif set(inputs) == {IMAGE_INPUT}:
            images = inputs[IMAGE_INPUT].reshape(-1).tolist()
            batch = self._images_to_batch([_image_bytes(item) for item in images])
        else:
            raise errors.BadInput(
                f"model {self.spec.id!r} takes one input: {TENSOR_INPUT!r} (FP32 [N,3,H,W]), "
                f"or instead the extension {IMAGE_INPUT!r} (BYTES [N] of encoded images); got {sorted(inputs)}"
            )
        batch = self._checked(batch)
        return Rows(batch.shape[0], batch, lambda r: {PROBABILITIES_OUTPUT: r.values})

    def forward(self, batch: list[Rows]) -> list[RowsResult]:
        """One pass over every request's images (all of this model's one size: no padding)."""
        values = self._classify(batch[0].payload if len(batch) == 1 else np.concatenate([r.payload for r in batch]))
        results, start = [], 0
        for rows in batch:
            results.append(RowsResult(values[start:start + rows.count]))
            start += rows.count
        return results

    def predict(self, input_data: Any) -> Any:
        rows = self.rows_for_predict(input_data)
        return rows.finish(self.forward([rows])[0])

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        rows = self.rows_for_infer(inputs, parameters)
        return rows.finish(self.forward([rows])[0])

    def inputs(self) -> list[TensorSpec]:
        """The one canonical input. ``image`` (BYTES [N] of encoded images) is an extension that
        infer also takes instead of it, and is not listed: OIP metadata lists what infer needs,
        and a generic client (tritonclient, perf_analyzer) builds every input listed."""
        d = self._description
        height, width = (d.height, d.width) if d else (-1, -1)
        return [TensorSpec(TENSOR_INPUT, "FP32", [-1, 3, height, width])]

    def outputs(self) -> list[TensorSpec]:
        classes = len(self._description.labels) if self._description else -1
        return [TensorSpec(PROBABILITIES_OUTPUT, "FP32", [-1, classes])]

    @property
    def labels(self) -> list[str]:
        return list(self._description.labels) if self._description else []

    def unload(self) -> None:
        dropped = [weakref.ref(self._model)] if self._model is not None else []
        self._model = None
        memory.release(dropped)

    def measured_bytes(self) -> int:
        return self._bytes

    def measures_its_own_bytes(self) -> bool:
        return True  # the module's parameters and buffers, counted tensor by tensor

    def is_ready(self) -> bool:
        return self._model is not None


def check_pixels(images: list[bytes]) -> None:
    """Read each image's header (not its pixels) and refuse (400) one over MAX_IMAGE_PIXELS, or a
    request whose images add up to more than MAX_REQUEST_PIXELS."""
    from PIL import Image, UnidentifiedImageError

    total = 0
    for index, encoded in enumerate(images):
        try:
            with Image.open(io.BytesIO(encoded)) as image:
                width, height = image.size
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
            raise errors.BadInput(f"cannot decode image {index} ({len(encoded)} bytes): {exc}") from exc
        if width * height > MAX_IMAGE_PIXELS:
            raise errors.BadInput(f"image {index} of {width}x{height} pixels exceeds the limit of {MAX_IMAGE_PIXELS} pixels")
        total += width * height
    if total > MAX_REQUEST_PIXELS:
        raise errors.BadInput(f"the request's {len(images)} images hold {total} pixels together; "
                              f"at most {MAX_REQUEST_PIXELS} per request (send fewer or smaller images)")


def _from_base64(text: str) -> bytes:
    """Base64 (plain or a data: URL) -> bytes; BadInput when it is not base64."""
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise errors.BadInput(f"image is not valid base64: {exc}") from exc


def _image_bytes(item: Any) -> bytes:
    """An OIP BYTES element: raw encoded image bytes, or base64 text of them (JSON clients)."""
    if isinstance(item, str):
        return _from_base64(item)
    if isinstance(item, bytes):
        if item[:8].startswith((b"\x89PNG", b"\xff\xd8", b"GIF8", b"BM", b"RIFF")):
            return item
        try:
            return _from_base64(item.decode("ascii"))
        except (UnicodeDecodeError, errors.BadInput):
            return item  # let the decoder name the problem
    raise errors.BadInput(f"input {IMAGE_INPUT!r} must be BYTES of encoded images, got {type(item).__name__}")


def _tensor_from_json(data: list[Any]) -> np.ndarray:
    try:
        array = np.asarray(data, dtype=np.float32)
    except (ValueError, TypeError) as exc:
        raise errors.BadInput(f"tensor input must be a rectangular nested list of numbers: {exc}") from exc
    return array[None] if array.ndim == 3 else array
