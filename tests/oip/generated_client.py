"""A client generated at run time from the standard grpc_predict_v2.proto, run as its own process.

``python generated_client.py OUT_DIR ADDRESS``: generate the stubs into OUT_DIR with grpcio-tools,
then call ServerLive, ServerReady, ServerMetadata, ModelMetadata, ModelInfer (typed and raw
contents) and ModelReady on the ``scaler`` model at ADDRESS, and print what came back as JSON.
A process of its own: its messages share the ``inference`` package's names with tritonclient's
stubs, and one protobuf runtime holds one definition of each name.
"""
from __future__ import annotations

import importlib
import json
import struct
import sys
from pathlib import Path

import grpc
from grpc_tools import protoc


def generate(out: Path) -> tuple[object, object]:
    proto = Path(__file__).with_name("grpc_predict_v2.proto")
    status = protoc.main(["protoc", f"-I{proto.parent}", f"--python_out={out}", f"--grpc_python_out={out}", proto.name])
    if status != 0:
        raise SystemExit(f"protoc failed ({status})")
    sys.path.insert(0, str(out))
    return importlib.import_module("grpc_predict_v2_pb2"), importlib.import_module("grpc_predict_v2_pb2_grpc")


def main(out: str, address: str) -> None:
    pb, stubs = generate(Path(out))
    with grpc.insecure_channel(address) as channel:
        stub = stubs.GRPCInferenceServiceStub(channel)
        typed = pb.ModelInferRequest(model_name="scaler", id="typed")
        typed.inputs.add(name="INPUT0", datatype="FP32", shape=[3]).contents.fp32_contents.extend([1.0, 2.0, 3.0])
        raw = pb.ModelInferRequest(model_name="scaler", id="raw")
        raw.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
        raw.raw_input_contents.append(struct.pack("<2f", 0.5, -4.0))
        raw.outputs.add(name="OUTPUT0")
        answers = [stub.ModelInfer(request, timeout=60) for request in (typed, raw)]
        metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="scaler"), timeout=30)
        report = {
            "live": stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live,
            "ready": stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready,
            "server": stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10).name,
            "inputs": [[t.name, t.datatype, list(t.shape)] for t in metadata.inputs],
            "model_ready": stub.ModelReady(pb.ModelReadyRequest(name="scaler"), timeout=10).ready,
            "answers": [{"id": a.id, "model": a.model_name, "outputs": [o.name for o in a.outputs],
                         "OUTPUT0": list(struct.unpack(f"<{len(a.raw_output_contents[0]) // 4}f", a.raw_output_contents[0]))}
                        for a in answers],
        }
        try:
            stub.ModelInfer(pb.ModelInferRequest(model_name="no-such-model", inputs=[typed.inputs[0]]), timeout=30)
        except grpc.RpcError as exc:
            report["unknown"] = [exc.code().name, exc.details()]
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:3])
