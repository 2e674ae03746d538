"""vllm models: one engine process per model, started by its load and stopped by its unload or eviction.

The engines here are the test-only stand-in (hotset_testing/standin_vllm.py),
started through the worker's ``--vllm-command`` exactly as vLLM's server
would be: what is proven is the worker's side (processes, flags, memory
shares, LoRA bookkeeping, forwarding), not vLLM itself.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Iterator

import httpx
import openai
import psutil
import pytest

from hotset_testing.polling import wait_for
from hotset_testing.processes import REPO, exited
from hotset_testing.worker_server import worker_process

sys.path.insert(0, str(REPO / "scripts"))
import local_stack  # noqa: E402

STANDIN = REPO / "tests" / "hotset_testing" / "standin_vllm.py"
MiB = 2**20
ADAPTER_BYTES = 3 * MiB


def standin_command(*flags: str) -> str:
    return " ".join([sys.executable, str(STANDIN), *flags])


def write_store(folder: Path, models: list[dict]) -> Path:
    for model in models:
        path = folder / model["id"]
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text("{}")
        if model.get("baseModel"):
            (path / "adapter_config.json").write_text(json.dumps({"r": 8}))
            (path / "adapter_model.safetensors").write_bytes(b"\0" * ADAPTER_BYTES)
        model.setdefault("framework", "vllm")
        model.setdefault("task", "text-generation")
        model["source"] = f"file://{path}"
    store = folder / "model-store.json"
    store.write_text(json.dumps({"models": models}))
    return store


MODELS = [
    {"id": "llm", "memory": "256Mi", "engineArgs": {"enable_lora": True, "max_loras": 2, "max_model_len": 512}},
    {"id": "llm-sql", "baseModel": "llm"},
    {"id": "other", "memory": "256Mi"},
    {"id": "third", "engineArgs": {"gpu_memory_utilization": 0.25}},
    {"id": "greedy", "memory": "256Mi", "engineArgs": {"trust_remote_code": True}},
    {"id": "unsized"},
    {"id": "warmed", "memory": "128Mi", "warmup": ["Hello there", {"messages": [{"role": "user", "content": "hi"}]}]},
    {"id": "overlong-warmup", "memory": "128Mi", "warmup": [{"prompt": "hi", "max_tokens": 100000}]},
]


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Iterator[local_stack.Process]:
    folder = tmp_path_factory.mktemp("vllm")
    store = write_store(folder, [dict(m) for m in MODELS])
    process = local_stack.start_worker(
        "vllm-pod", store, folder / "logs", "600Mi",
        extra_args=["--vllm-command", standin_command(), "--vllm-device-memory", "1Gi", "--min-residency-s", "0",
                    "--admission-control", "off", "--failed-load-backoff-s", "0"])
    try:
        local_stack.wait_http(process, "/v2/health/ready", 90)
        yield process
    except BaseException:
        print(process.log_tail(80), file=sys.stderr)
        raise
    finally:
        process.stop()


def engines(worker: local_stack.Process) -> dict[str, psutil.Process]:
    """The worker's live engine processes by the model they serve."""
    found = {}
    for child in psutil.Process(worker.pid).children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if str(STANDIN) in argv and child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
            found[argv[argv.index("--served-model-name") + 1]] = child
    return found


def engine_state(process: psutil.Process) -> dict:
    argv = process.cmdline()
    return httpx.get(f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/standin/state", timeout=5).json()


def copies(worker: local_stack.Process) -> dict[str, dict]:
    return {c["id"]: c for c in httpx.get(f"{worker.url}/status", timeout=5).json()["models"]}


def unload(worker: local_stack.Process, model: str) -> None:
    assert httpx.post(f"{worker.url}/v2/repository/models/{model}/unload", timeout=60).status_code == 200


@pytest.fixture
def client(worker):
    with openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        yield client
    for model, copy in copies(worker).items():
        if copy["state"] == "READY":
            unload(worker, model)


def ask(client: openai.OpenAI, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    return answer.choices[0].message.content


def test_a_model_is_an_engine_process_started_by_its_load_and_stopped_by_its_unload(worker, client) -> None:
    assert ask(client, "llm") == "the engine streams one"
    (engine,) = engines(worker).values()
    state = engine_state(engine)
    assert state["served"] == "llm" and state["gpu_memory_utilization"] == 0.25  # 256Mi of a 1Gi device
    assert state["enable_lora"] and state["max_model_len"] == 512  # engineArgs as vLLM's flags
    assert copies(worker)["llm"]["bytes"] == 256 * MiB  # its share of the device, not a model count
    unload(worker, "llm")
    wait_for(lambda: exited(engine), "the unloaded engine's process to exit", timeout=10)
    assert engines(worker) == {} and "llm" not in copies(worker)


def test_an_engine_takes_only_its_workers_calls_reports_no_usage_and_computes_on_cores_of_its_own(
        worker, client) -> None:
    ask(client, "llm")
    ask(client, "other")
    running = engines(worker)
    states = {model: engine_state(engine) for model, engine in running.items()}
    assert all(state["usage_stats_off"] and state["keyed"] for state in states.values())
    for engine in running.values():  # the engine's own port, without the worker's key
        argv = engine.cmdline()
        key = engine.environ()["VLLM_API_KEY"]  # in its environment, which only its user can read
        assert len(key) >= 32 and not any(key in arg or "api-key" in arg for arg in argv), argv
        direct = httpx.post(f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/v1/load_lora_adapter",
                            json={"lora_name": "x", "lora_path": "/tmp"}, timeout=5)
        assert direct.status_code == 401
    binds = [set(map(int, state["cpu_bind"].split(","))) for state in states.values()]
    assert all(binds) and binds[0] <= os.sched_getaffinity(0)
    if len(os.sched_getaffinity(0)) >= 2:
        assert not binds[0] & binds[1], f"two engines on the same cores: {binds}"


def test_a_warm_up_runs_through_the_engine_before_ready_and_a_refused_one_fails_the_load(worker, client) -> None:
    assert ask(client, "warmed") == "the engine streams one"
    assert engine_state(engines(worker)["warmed"])["requests"]["warmed"] >= 3  # probe, two warm-ups, the ask
    with pytest.raises(openai.APIStatusError) as refused:
        ask(client, "overlong-warmup")
    assert "warm-up" in refused.value.body["message"] and "maximum context length" in refused.value.body["message"]
    wait_for(lambda: "overlong-warmup" not in engines(worker), "the failed copy's engine to stop", timeout=15)
    assert copies(worker)["overlong-warmup"]["state"] == "FAILED" and copies(worker)["warmed"]["state"] == "READY"


def test_an_engine_setting_the_pinned_vllm_lacks_is_refused_by_name() -> None:
    from hotset_worker.frameworks.vllm_worker import engine_flags
    from hotset_common import errors

    with pytest.raises(errors.ModelLoadFailed, match="swap_space: vLLM 0.32.0 has no --swap-space"):
        engine_flags({"swap_space": 4})
    assert engine_flags({"max_model_len": 512, "enforce_eager": True}) == ["--enforce-eager", "--max-model-len", "512"]
    assert engine_flags({"enable_prefix_caching": False}) == ["--no-enable-prefix-caching"]


@pytest.mark.parametrize("args, words", [
    ({"swap_space": 4}, "vLLM 0.32.0 has no --swap-space"),
    ({"max_model_length": 9}, "did you mean max_model_len?"),
    ({"trust_remote_code": True}, "--trust-remote-code is a flag of vLLM 0.32.0 that hotset does not pass"),
    ({"api_key": "x"}, "--api-key is set by the worker"),
    ({"lora_modules": "a=/b"}, "from spec.loraAdapters"),
    ({"max-model-len": 512}, "write it as max_model_len"),
    ({"enforce_eager": "yes"}, "--enforce-eager is on or off"),
    ({"max_num_seqs": True}, "--max-num-seqs takes a value, not true"),
    ({"max_num_seqs": "many"}, "--max-num-seqs takes a whole number, not 'many'"),
    ({"max_model_len": "lots"}, "such as 8192 or 8k, or auto"),
    ({"gpu_memory_utilization": "half"}, "takes a number"),
    ({"dtype": "float33"}, "--dtype is one of auto, bfloat16, float, float16, float32, half, not 'float33'"),
])
def test_engine_arguments_are_checked_against_the_pinned_vllms_flags_and_the_projects_list(args, words) -> None:
    """Pure: the table generated from vLLM's parser (hotset_common.vllm_flags) and the project's list."""
    from hotset_common import engine_args

    [(key, message)] = engine_args.problems(args)
    assert key == next(iter(args)) and words in message, message


def test_every_engine_argument_the_project_passes_is_a_flag_of_the_pinned_vllm() -> None:
    from hotset_common import engine_args, vllm_flags

    for key in engine_args.ALLOWED | engine_args.SET_BY_WORKER:
        assert key in vllm_flags.FLAGS and vllm_flags.FLAGS[key]["flag"] == "--" + key.replace("_", "-"), key
    assert not engine_args.problems({"max_model_len": "8k", "dtype": "float32", "enable_lora": True, "seed": 0,
                                     "gpu_memory_utilization": 0.5, "max_num_batched_tokens": 4096})


def test_a_share_given_as_gpu_memory_utilization_counts_as_its_bytes(worker, client) -> None:
    ask(client, "third")
    assert engine_state(engines(worker)["third"])["gpu_memory_utilization"] == 0.25
    assert copies(worker)["third"]["bytes"] == 256 * MiB


def test_a_full_budget_stops_one_engine_to_start_another(worker, client) -> None:
    ask(client, "llm")
    ask(client, "other")  # 512Mi of 600Mi
    first = engines(worker)
    ask(client, "third")  # a third share does not fit: one engine goes (the manager loads first, evicts after)
    after = wait_for(lambda: (found if len(found := engines(worker)) == 2 else None), "one engine to stop", timeout=30)
    assert "third" in after
    (gone,) = set(first) - set(after)
    wait_for(lambda: exited(first[gone]), "the evicted engine's process to exit", timeout=10)
    assert sum(c["bytes"] for c in copies(worker).values() if c["state"] == "READY") <= 600 * MiB


def test_an_engine_that_dies_is_dropped_and_the_next_request_starts_another(worker, client) -> None:
    ask(client, "other")
    old = engines(worker)["other"]
    os.kill(old.pid, signal.SIGKILL)  # an engine crash (the stand-in's pid, started by this worker)
    wait_for(lambda: "other" not in copies(worker), "the worker to drop the dead engine's copy", timeout=15)
    assert ask(client, "other") == "the engine streams one"
    assert engines(worker)["other"].pid != old.pid


def test_a_request_arriving_just_after_its_engine_died_waits_for_a_new_one(tmp_path) -> None:
    store = write_store(tmp_path, [{"id": "llm", "memory": "256Mi"}])
    args = ["--model-store", str(store), "--memory-budget", "1Gi", "--vllm-device-memory", "1Gi",
            "--vllm-command", standin_command(), "--backend-sync-s", "600"]  # no sync drops the copy first
    with worker_process(args) as url, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                                                    timeout=60) as openai_client:
        ask(openai_client, "llm")
        (old,) = [p for p in psutil.Process().children(recursive=True) if str(STANDIN) in p.cmdline()]
        old.kill()
        wait_for(lambda: exited(old), "the engine to die", timeout=10)  # a zombie until the worker looks
        assert httpx.get(f"{url}/status", timeout=5).json()["models"][0]["state"] == "READY"  # as far as it knows
        assert ask(openai_client, "llm") == "the engine streams one"  # waited for a new engine, no 503
        assert len(live := [p for p in psutil.Process().children(recursive=True)
                            if not exited(p) and str(STANDIN) in p.cmdline()]) == 1 and live[0].pid != old.pid


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_request_reaching_an_engine_that_is_dying_waits_for_a_new_one(tmp_path) -> None:
    """vLLM's API server outlives its engine core by a moment: it stops answering (connections
    refused or cut) before its process exits. A request that reaches it then is not a 503: the
    worker sees the process exit, drops the copy and answers from a new engine."""
    store = write_store(tmp_path, [{"id": "llm", "memory": "256Mi"}])
    args = ["--model-store", str(store), "--memory-budget", "1Gi", "--vllm-device-memory", "1Gi",
            "--vllm-command", f"{standin_command()} --standin-dying-s 1.5", "--backend-sync-s", "600"]
    with worker_process(args) as url, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                                                    timeout=60) as openai_client:
        ask(openai_client, "llm")
        (old,) = [p for p in psutil.Process().children(recursive=True) if str(STANDIN) in p.cmdline()]
        old.send_signal(signal.SIGUSR1)  # its engine core died: it cuts every connection, exits 1.5 s later
        port = int(old.cmdline()[old.cmdline().index("--port") + 1])
        wait_for(lambda: _refuses(port), "the dying engine to stop listening", timeout=10)
        assert not exited(old)
        assert ask(openai_client, "llm") == "the engine streams one"  # waited for a new engine, no 503
        assert exited(old)
        assert len(live := [p for p in psutil.Process().children(recursive=True)
                            if not exited(p) and str(STANDIN) in p.cmdline()]) == 1 and live[0].pid != old.pid


def test_an_adapter_loads_into_its_bases_engine_and_only_while_the_base_is_loaded(worker, client) -> None:
    assert ask(client, "llm-sql").startswith("[llm-sql]")  # the adapter answered, through the base's engine
    (engine,) = engines(worker).values()  # no engine of its own
    assert engine_state(engine)["loras"] == ["llm-sql"]
    held = copies(worker)
    assert held["llm-sql"]["bytes"] == ADAPTER_BYTES and held["llm"]["bytes"] == 256 * MiB  # a light model
    unload(worker, "llm")
    wait_for(lambda: "llm-sql" not in copies(worker), "the adapter to go with its base", timeout=15)
    assert ask(client, "llm-sql").startswith("[llm-sql]")  # both come back for the next request
    assert engine_state(engines(worker)["llm"])["loras"] == ["llm-sql"]


def test_models_lists_adapters_with_their_base(client) -> None:
    parents = {model.id: model.parent for model in client.models.list()}
    assert parents["llm-sql"] == "llm" and parents["llm"] is None


@pytest.mark.parametrize(("model", "says"), [
    ("greedy", "trust_remote_code"),
    ("unsized", "gpu_memory_utilization"),
])
def test_a_model_the_worker_cannot_start_is_a_clear_error_and_nothing_is_evicted(worker, client, model, says) -> None:
    ask(client, "llm")
    with pytest.raises(openai.APIStatusError) as refused:
        ask(client, model)
    assert refused.value.status_code == 500 and says in refused.value.body["message"]
    assert copies(worker)["llm"]["state"] == "READY" and list(engines(worker)) == ["llm"]


@pytest.mark.parametrize("on_gpu", [True, False])
def test_engines_start_one_at_a_time_on_a_gpu_and_side_by_side_on_cpu(tmp_path, on_gpu) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from hotset_common.spec import ModelSpec
    from hotset_worker.vllm_engines import CoreSets, VllmEngines

    engines = VllmEngines(VllmEngines.parse_command(standin_command("--standin-start-delay-s", "2")), 2**30,
                          cpu_cores=None if on_gpu else CoreSets([0], 1))
    specs = [ModelSpec(id=f"m{i}", framework="vllm", task="text-generation", source=f"file://{tmp_path}")
             for i in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:  # two loads at once, as two load threads would
            started = list(pool.map(lambda spec: engines.start(spec, tmp_path, []), specs))
        created = sorted(psutil.Process(engine.pid).create_time() for engine in started)
        if on_gpu:  # the second engine's process began only after the first answered (2 s start)
            assert created[1] - created[0] >= 1.9
        else:
            assert created[1] - created[0] < 1.5
    finally:
        for spec in specs:
            engines.stop(spec.id)


@pytest.mark.parametrize(("standin_flag", "says"), [
    ("--standin-fail-start", "CUDA out of memory"),  # exits while starting
    ("--standin-die-on-first-request", "head size 16 is not supported"),  # answers /health, dies on a token
])
def test_an_engine_that_cannot_run_its_model_is_a_failed_load_quoting_its_last_words(
        tmp_path, standin_flag, says) -> None:
    store = write_store(tmp_path, [{"id": "llm", "memory": "256Mi"}])
    args = ["--model-store", str(store), "--memory-budget", "1Gi", "--vllm-device-memory", "1Gi",
            "--vllm-command", standin_command(standin_flag, f"'{says}'")]
    with worker_process(args) as url:
        answer = httpx.post(f"{url}/v1/completions", json={"model": "llm", "prompt": "hi"}, timeout=60)
        assert answer.status_code == 500 and says in answer.json()["error"]["message"]
        (failed,) = httpx.get(f"{url}/status", timeout=5).json()["models"]
        assert failed["state"] == "FAILED" and says in failed["reason"]  # never READY


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_pod_without_vllm_refuses_vllm_models_with_a_503_saying_so(tmp_path) -> None:
    store = write_store(tmp_path, [{"id": "llm", "memory": "256Mi"}])
    with worker_process(["--model-store", str(store), "--memory-budget", "1Gi"]) as url:
        assert httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200  # the pod itself is fine
        answer = httpx.post(f"{url}/v1/completions", json={"model": "llm", "prompt": "hi"}, timeout=60)
        assert answer.status_code == 503 and "needs vLLM" in answer.json()["error"]["message"]
        assert answer.headers["retry-after"]


def test_the_engines_own_figures_are_exported_as_the_inference_extensions_metrics_and_reported(worker, client) -> None:
    """The worker reads each engine's /metrics (the stand-in answers in vLLM's names: running is what
    streams now, a sixteenth of its 64 KV-cache blocks per running request) and exports the pod's as
    the Gateway API Inference Extension's model-server metrics, one series per pod (its engines
    together), and reports each engine's figures in /status for the routers."""
    from hotset_common import metrics as names
    from hotset_testing.scrape import metric

    ask(client, "llm-sql")  # llm's engine, with a runtime adapter resident in it

    def reported() -> dict:
        return {e["model"]: e for e in httpx.get(f"{worker.url}/status", timeout=5).json()["engines"]}

    llm = wait_for(lambda: (e := reported().get("llm")) and e["running_lora_adapters"] and e, "llm's figures")
    assert (llm["kv_cache_blocks"], llm["block_size"], llm["max_lora"], llm["running"]) == (64, 16, 2, 0)
    assert llm["running_lora_adapters"] == ["llm-sql"] and llm["age_s"] < 5
    streamed: list[str] = []

    def stream() -> None:  # read as it comes: a client that stops reading is cut as a slow one
        with httpx.stream("POST", f"{worker.url}/v1/completions", timeout=60, json={
                "model": "other", "prompt": "a long one", "max_tokens": 2000, "stream": True}) as answer:  # 10 s
            streamed.extend(answer.iter_lines())

    reader = threading.Thread(target=stream)
    reader.start()
    try:
        other = wait_for(lambda: (e := reported().get("other")) and e["running"] == 1 and e, "other's figures")
        assert other["kv_cache_usage"] == 1 / 16 and other["max_lora"] == 0
        pod = {"pod": "vllm-pod"}
        wait_for(lambda: metric(worker.url, names.MODEL_SERVER_RUNNING, **pod) == 1, "the pod's running requests")
        assert metric(worker.url, names.MODEL_SERVER_WAITING, **pod) == 0
        assert metric(worker.url, names.MODEL_SERVER_KV_CACHE_USAGE, **pod) == 1 / 32  # 4 of both engines' 128 blocks
        assert metric(worker.url, names.MODEL_SERVER_LORA_INFO, **pod, max_lora="2",
                      running_lora_adapters="llm-sql", waiting_lora_adapters="") > 1e9  # when it was read
    finally:
        reader.join()
    assert "data: [DONE]" in streamed
