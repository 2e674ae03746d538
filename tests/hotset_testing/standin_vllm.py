"""A STAND-IN for vLLM's OpenAI server, for tests and benchmarks on machines without a GPU. Not vLLM.

It takes the command line the worker gives a real engine (``--model``,
``--served-model-name``, ``--port``, ``--gpu-memory-utilization``,
``--enable-lora``, ``--max-loras``, ``--max-model-len``...; other flags are
accepted and ignored) and answers the parts of vLLM's HTTP API that
hotset uses: ``/health``, ``/v1/models``, completions and chat
completions (streamed or whole), and runtime LoRA loading
(``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, refused unless
``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` are set, as vLLM
refuses them). Given ``--api-key`` (or ``VLLM_API_KEY``, as vLLM reads it),
its ``/v1`` routes answer 401 without that key, as vLLM's do; ``/health`` stays open. It loads no weights: its "tokens" are the words of a fixed
text, produced ``--standin-token-delay-s`` seconds apart (a paced
generator whose gaps a benchmark can compare), prefixed with the LoRA
adapter's name when one is asked for. ``GET /standin/state`` says how it was
started, what it holds and how many requests each prompt prefix brought.

What it proves: the worker's process management (start, health, stop by
pid), its flags and memory share, forwarding and streaming untouched, LoRA
bookkeeping and routing. What it cannot prove: anything about vLLM itself
(batching, KV cache, its memory use, its real flags on a given version).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from hotset_common import openai_wire

WORDS = "the engine streams one word at a time so that every gap between two chunks can be measured".split()


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name", nargs="+", default=None)  # vLLM's: the first names its answers
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-loras", type=int, default=1)
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY", ""))  # vLLM's: the flag, else the variable
    # The stand-in's own flags (a test puts them in the worker's --vllm-command):
    p.add_argument("--standin-token-delay-s", type=float, default=0.005, help="seconds between two tokens")
    p.add_argument("--standin-start-delay-s", type=float, default=0.0, help="a slow start (weights, CUDA graphs)")
    p.add_argument("--standin-fail-start", default="", help="exit at once with this message (a model vLLM cannot load)")
    p.add_argument("--standin-dying-s", type=float, default=2.0,
                   help="on SIGUSR1 (its engine core died), seconds between dropping every connection and "
                        "exiting, as vLLM's API server takes to shut down after its engine core")
    p.add_argument("--standin-die-on-first-request", default="",
                   help="answer /health, then exit with this message on the first generation (a model shape "
                        "vLLM's kernels lack)")
    return p.parse_known_args(argv)


def vllm_error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse(openai_wire.error_body(message, status), status_code=status)


def create_app(args: argparse.Namespace, ignored: list[str], token_delay_s: float) -> FastAPI:
    app = FastAPI()
    names = args.served_model_name or [args.model]
    served = names[0]
    loras: dict[str, str] = {}
    by_prefix: collections.Counter[str] = collections.Counter()
    requests = collections.Counter()
    running = [0]  # streams being answered now

    @app.middleware("http")
    async def require_key(request: Request, call_next):  # type: ignore[no-untyped-def]
        if args.api_key and request.url.path.startswith("/v1") and \
                request.headers.get("authorization") != f"Bearer {args.api_key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        """vLLM's own series the worker reads (its names and labels; made-up figures: running is what
        streams now, the KV cache a sixteenth per running request of 64 blocks)."""
        label = f'engine="0",model_name="{served}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{label}}} {running[0]}.0",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{label}}} 0.0",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{label}}} {min(1.0, running[0] / 16)}",
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge", f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="64",{label}}} 1.0',
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter", f"vllm:prefix_cache_queries_total{{{label}}} {sum(requests.values())}.0",
        ]
        if args.enable_lora:
            lines += ["# HELP vllm:lora_requests_info Running stats on lora requests.", "# TYPE vllm:lora_requests_info gauge",
                      f'vllm:lora_requests_info{{max_lora="{args.max_loras}",running_lora_adapters="{",".join(sorted(loras))}",'
                      f'waiting_lora_adapters=""}} {time.time()}']
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    @app.get("/standin/state")
    async def state() -> dict[str, Any]:
        return {"pid": os.getpid(), "served": served, "model": args.model, "loras": sorted(loras),
                "keyed": bool(args.api_key), "cpu_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
                "usage_stats_off": os.environ.get("VLLM_NO_USAGE_STATS") == "1" and os.environ.get("DO_NOT_TRACK") == "1",
                "gpu_memory_utilization": args.gpu_memory_utilization, "enable_lora": args.enable_lora,
                "max_model_len": args.max_model_len, "ignored_flags": ignored, "requests": dict(requests),
                "prefixes": dict(by_prefix)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = [openai_wire.model_card(served, owned_by="vllm")]
        cards += [openai_wire.model_card(name, owned_by="vllm", parent=served) for name in sorted(loras)]
        return {"object": "list", "data": cards}

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request) -> Response:
        if not args.enable_lora or os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() not in ("1", "true"):
            return vllm_error("LoRA is not enabled: start with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING")
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if name in loras:
            return vllm_error(f"The lora adapter '{name}' has already been loaded.")
        if not path or not Path(path).is_dir():
            return vllm_error(f"no adapter at {path!r}", 404)
        if len(loras) >= args.max_loras:
            return vllm_error(f"at most {args.max_loras} LoRA adapters (--max-loras)")
        loras[name] = path
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request) -> Response:
        name = (await request.json()).get("lora_name")
        if loras.pop(name, None) is None:
            return vllm_error(f"The lora adapter '{name}' cannot be found.", 404)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    async def generate(request: Request, chat: bool) -> Response:
        if args.standin_die_on_first_request:
            print(f"standin: {args.standin_die_on_first_request}", flush=True)
            os._exit(4)
        body = await request.json()
        model = body.get("model")
        if model not in names and model not in loras:
            return vllm_error(f"The model `{model}` does not exist.", 404)
        prompt = openai_wire.prompt_prefix(body, 10**6)
        prompt_tokens = max(1, len(prompt.split()))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        if prompt_tokens + max_tokens > args.max_model_len:
            return vllm_error(f"This model's maximum context length is {args.max_model_len} tokens. However, you "
                              f"requested {prompt_tokens + max_tokens} tokens.")
        requests[model] += 1
        by_prefix[openai_wire.prompt_prefix(body)] += 1
        words = [f"[{model}]"] if model in loras else []
        words += [WORDS[i % len(WORDS)] for i in range(max_tokens - len(words))]
        kind = "chatcmpl" if chat else "cmpl"
        answer_id = openai_wire.new_id(kind)
        if not body.get("stream"):
            await asyncio.sleep(token_delay_s * len(words))
            build = openai_wire.chat_completion if chat else openai_wire.completion
            return JSONResponse(build(answer_id, model, " ".join(words), "length", prompt_tokens, len(words))
                                | {"system_fingerprint": f"standin-{args.port}"})

        async def events() -> AsyncIterator[bytes]:
            running[0] += 1
            try:
                async for event in stream():
                    yield event
            finally:
                running[0] -= 1

        async def stream() -> AsyncIterator[bytes]:
            for index, word in enumerate(words):
                await asyncio.sleep(token_delay_s)
                text = word if index == 0 else " " + word
                chunk = (openai_wire.chat_chunk(answer_id, model, {"content": text}) if chat
                         else openai_wire.completion_chunk(answer_id, model, text))
                # When the chunk left the generator (wall clock, same machine): benchmarks compare arrivals with it.
                yield openai_wire.event(chunk | {"system_fingerprint": f"standin-{args.port}", "x_emitted_at": time.time()})
            last = (openai_wire.chat_chunk(answer_id, model, {}, "length") if chat
                    else openai_wire.completion_chunk(answer_id, model, "", "length"))
            yield openai_wire.event(last)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield openai_wire.event(openai_wire.usage_chunk(answer_id, model, last["object"], prompt_tokens, len(words)))
            yield openai_wire.DONE_EVENT

        return StreamingResponse(events(), media_type=openai_wire.EVENT_STREAM)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    return app


async def exit_with_parent(parent: int) -> None:
    """A stand-in never outlives the worker that started it (a real engine is stopped by the worker)."""
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    args, ignored = parse(sys.argv[1:] if argv is None else argv)
    if args.standin_fail_start:
        print(f"standin: refusing to start: {args.standin_fail_start}", flush=True)
        sys.exit(3)
    print(f"standin vLLM engine for {' '.join(args.served_model_name or [args.model])} on port {args.port} "
          f"(gpu_memory_utilization {args.gpu_memory_utilization})", flush=True)
    time.sleep(args.standin_start_delay_s)
    app = create_app(args, ignored, args.standin_token_delay_s)
    parent = os.getppid()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        watcher = loop.create_task(exit_with_parent(parent))
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))

        def engine_core_died() -> None:
            """Alive for --standin-dying-s more, answering nobody: it stops listening and cuts
            every connection (a request then sees a refused or reset connection), then exits."""
            print("standin: its engine core died; shutting down", flush=True)
            for listener in server.servers:
                listener.close()
            for connection in list(server.server_state.connections):
                connection.transport.abort()
            loop.call_later(args.standin_dying_s, os._exit, 1)

        loop.add_signal_handler(signal.SIGUSR1, engine_core_died)
        await server.serve()
        watcher.cancel()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
