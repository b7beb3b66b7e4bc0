"""The REST server answers TF Serving's API, rejects bad requests with 4xx, and keeps serving."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from kerasformer import data
from kerasformer.export import export
from kerasformer.generate import generate
from kerasformer.models import from_preset
from kerasformer.serve import RequestError, ServedModel
from tests.conftest import to_numpy


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port, method, path, body=None, raw=None, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    connection.request(method, path, body=payload, headers=headers or {})
    response = connection.getresponse()
    text = response.read()
    connection.close()
    return response.status, json.loads(text)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tokenizer = data.train_tokenizer("char", ["abcdefghij"])
    model = from_preset("gpt2-tiny", vocab_size=int(tokenizer.vocabulary_size()))
    return model, export(model, tmp_path_factory.mktemp("saved_models") / "tiny", tokenizer=tokenizer)


@pytest.fixture(scope="module")
def server(exported):
    model, path = exported
    port = free_port()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.Popen(
        [sys.executable, "-m", "kerasformer.cli", "serve", str(path), "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if call(port, "GET", "/v1/models/tiny")[0] == 200:
                break
        except OSError:
            time.sleep(0.5)
    else:
        process.kill()
        pytest.fail("The server did not start: " + process.stdout.read()[-2000:])
    yield port, model, process
    if process.poll() is None:
        process.kill()


GOOD = {"instances": [{"token_ids": [5, 6, 7], "padding_mask": [1, 1, 1]}]}


def good_request_succeeds(port):
    status, body = call(port, "POST", "/v1/models/tiny:predict", GOOD)
    return status == 200 and len(body["predictions"]) == 1


def test_status_and_metadata(server):
    port, _, _ = server
    status, body = call(port, "GET", "/v1/models/tiny")
    assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
    status, body = call(port, "GET", "/v1/models/tiny/metadata")
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert {"serving_default", "generate", "generate_text", "beam_search", "beam_search_text"} <= set(signatures)
    assert signatures["generate"]["inputs"]["token_ids"]["dtype"] == "DT_INT32"


def test_row_and_columnar_formats_give_the_model_logits(server):
    port, model, _ = server
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    expected = to_numpy(model(ids))
    status, rows = call(port, "POST", "/v1/models/tiny:predict", {
        "instances": [{"token_ids": row.tolist(), "padding_mask": [1, 1, 1]} for row in ids]})
    assert status == 200
    np.testing.assert_allclose(np.array(rows["predictions"]), expected, atol=1e-4)
    status, columns = call(port, "POST", "/v1/models/tiny:predict", {
        "signature_name": "serving_default", "inputs": {"token_ids": ids.tolist(), "padding_mask": np.ones_like(ids).tolist()}})
    assert status == 200
    np.testing.assert_allclose(np.array(columns["outputs"]), expected, atol=1e-4)


GENERATION = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}


def test_generate_and_text_signatures(server):
    port, model, _ = server
    status, body = call(port, "POST", "/v1/models/tiny:predict", {"signature_name": "generate", "inputs": {
        "token_ids": [[5, 6, 7]], "padding_mask": [[1, 1, 1]], "max_new_tokens": 4, **GENERATION, "stop_token_ids": []}})
    assert status == 200
    np.testing.assert_array_equal(body["outputs"], generate(model, [[5, 6, 7]], max_new_tokens=4))
    status, body = call(port, "POST", "/v1/models/tiny:predict", {"signature_name": "generate_text", "inputs": {
        "text": ["abc"], "max_new_tokens": 3, **GENERATION}})
    assert status == 200 and body["outputs"][0].startswith("abc")
    # Past the context (128) in windows, as `generate`.
    prompt = [[5, 6, 7] * 20]
    status, body = call(port, "POST", "/v1/models/tiny:predict", {"signature_name": "generate", "inputs": {
        "token_ids": prompt, "max_new_tokens": 100, **GENERATION}})
    assert status == 200
    np.testing.assert_array_equal(body["outputs"], generate(model, prompt, max_new_tokens=100))
    # Beam search: 4 beams and a length penalty of 1 unless a request says otherwise, as `generate(num_beams=4)`.
    prompts = [[5, 6, 7], [8, 9]]
    status, body = call(port, "POST", "/v1/models/tiny:predict", {"signature_name": "beam_search", "inputs": {
        "token_ids": prompts, "max_new_tokens": 6}})
    assert status == 200
    np.testing.assert_array_equal(body["outputs"], generate(model, prompts, max_new_tokens=6, num_beams=4))
    status, body = call(port, "POST", "/v1/models/tiny:predict", {"signature_name": "beam_search", "instances": [
        {"token_ids": [5, 6, 7], "num_beams": 2, "length_penalty": 0.5, "stop_token_ids": [9], "max_new_tokens": 5}]})
    assert status == 200
    np.testing.assert_array_equal(body["predictions"], generate(
        model, [[5, 6, 7]], max_new_tokens=5, num_beams=2, length_penalty=0.5, stop_token_ids=[9]))
    status, body = call(port, "POST", "/v1/models/tiny:predict", {"signature_name": "beam_search_text", "inputs": {
        "text": ["abc"], "max_new_tokens": 3, "num_beams": 3}})
    new = generate(model, [[ord(c) for c in "abc"]], max_new_tokens=3, num_beams=3)[0].tolist()
    assert (status, body) == (200, {"outputs": ["abc" + "".join(chr(i) for i in new[: new.index(0) if 0 in new else 3])]})


def test_left_out_options_and_masks_take_their_defaults(server):
    # TF Serving needs every input; this server fills in greedy decoding of 32 tokens, no filter, no stop
    # token, and a padding mask of ones, so a request names only what it means.
    port, model, _ = server
    predict = lambda body: call(port, "POST", "/v1/models/tiny:predict", body)  # noqa: E731
    status, body = predict({"signature_name": "generate", "inputs": {"token_ids": [[5, 6, 7], [8, 9, 10]]}})
    assert status == 200
    np.testing.assert_array_equal(body["outputs"], generate(model, [[5, 6, 7], [8, 9, 10]], max_new_tokens=32))
    full = {"text": ["abc", "ba"], "max_new_tokens": 32, **GENERATION}
    rows = predict({"signature_name": "generate_text", "instances": ["abc", "ba"]})
    assert rows[0] == 200 and rows[1]["predictions"] == predict({"signature_name": "generate_text", "inputs": full})[1]["outputs"]
    # Prompts of different lengths without a mask: padded, and masked as padding.
    status, body = predict({"signature_name": "generate", "instances": [{"token_ids": [5, 6, 7]}, {"token_ids": [8]}]})
    assert status == 200
    np.testing.assert_array_equal(body["predictions"], generate(model, [[5, 6, 7], [8]], max_new_tokens=32))
    status, body = predict({"signature_name": "generate", "inputs": {"token_ids": [[5, 6, 7], [8, "x"]]}})
    assert (status, body) == (400, {"error": "Input 'token_ids' must hold numbers of dtype int32 (rows of equal length)."})
    # A number past int32 is refused, not wrapped: seed 2**32 + 7 would be seed 7, top_k 2**32 + 1 would be 1.
    for option in ("seed", "top_k"):
        status, body = predict({"signature_name": "generate", "inputs": {"token_ids": [[5]], "temperature": 1.0, option: 2**32 + 1}})
        assert (status, body) == (400, {"error": f"Input {option!r} must hold int32 numbers, in [-2147483648, 2147483647]."})
    status, body = predict({"instances": [[5, 6, 7]]})  # serving_default's ids, rows of one input.
    assert status == 200
    np.testing.assert_allclose(body["predictions"], to_numpy(model(np.array([[5, 6, 7]]))), atol=1e-4)
    status, body = predict({"signature_name": "generate", "inputs": {"padding_mask": [[1, 1]]}})
    assert (status, body) == (400, {"error": "Missing inputs ['padding_mask', 'token_ids'] for 'generate'."})
    status, body = predict({"signature_name": "generate", "instances": [{"token_ids": [5], "top_k": 3}, {"token_ids": [6]}]})
    assert (status, body) == (400, {"error": "Every instance needs the input 'top_k', or none (its default)."})


@pytest.mark.parametrize("name,request_kwargs,expected_status", [
    ("bad json", dict(raw=b"{not json"), 400),
    ("not an object", dict(body=[1, 2]), 400),
    ("both formats", dict(body={"instances": [], "inputs": {}}), 400),
    ("empty instances", dict(body={"instances": []}), 400),
    ("wrong signature", dict(body={"signature_name": "nope", **GOOD}), 400),
    ("unknown input", dict(body={"instances": [{"token_ids": [1], "padding_mask": [1], "extra": 1}]}), 400),
    ("missing input", dict(body={"instances": [{"padding_mask": [1, 1]}]}), 400),
    ("wrong rank", dict(body={"inputs": {"token_ids": [1, 2], "padding_mask": [1, 1]}}), 400),
    ("wrong dtype", dict(body={"inputs": {"token_ids": [["a", "b"]], "padding_mask": [[1, 1]]}}), 400),
    ("fractional ids", dict(body={"inputs": {"token_ids": [[1.5, 2]], "padding_mask": [[1, 1]]}}), 400),
    ("ragged rows", dict(body={"inputs": {"token_ids": [[1, 2], [3]], "padding_mask": [[1, 1], [1]]}}), 400),
    ("ragged rows of a given mask", dict(body={"inputs": {"token_ids": [[1, 2], [3]], "padding_mask": [[1, 1], [1, 0]]}}), 400),
    ("token id out of range", dict(body={"inputs": {"token_ids": [[1, 99999]], "padding_mask": [[1, 1]]}}), 400),
    ("negative token id", dict(body={"inputs": {"token_ids": [[-1, 2]], "padding_mask": [[1, 1]]}}), 400),
    ("empty sequence", dict(body={"inputs": {"token_ids": [[]], "padding_mask": [[]]}}), 400),
    ("too many new tokens", dict(body={"signature_name": "generate", "inputs": {"token_ids": [[1]], "max_new_tokens": 10**6}}), 400),
    ("stop id out of range", dict(body={"signature_name": "generate", "inputs": {"token_ids": [[1]], "stop_token_ids": [99999]}}), 400),
    # Each of these four had been answered 500 or 200.
    ("nested too deeply", dict(raw=b"[" * 100000 + b"]" * 100000), 400),
    ("nested too deeply in an input", dict(raw=b'{"inputs": {"token_ids": ' + b"[" * 5000 + b"]" * 5000 + b"}}"), 400),
    ("signature name not a string", dict(body={"signature_name": ["generate"], **GOOD}), 400),
    ("true for a number", dict(body={"signature_name": "generate", "inputs": {"token_ids": [[1]], "max_new_tokens": True}}), 400),
    ("a lone surrogate in a text", dict(raw=b'{"signature_name": "generate_text", "inputs": {"text": ["ab\\ud800"]}}'), 400),
    ("too large", dict(raw=b"{}", headers={"Content-Length": str(10**9)}), 413),
    # Read as -1, it would wait for the client to hang up, holding a worker.
    ("negative length", dict(raw=b"{}", headers={"Content-Length": "-1"}), 400),
    ("length not a number", dict(raw=b"{}", headers={"Content-Length": "two"}), 400),
])
def test_malformed_requests_get_4xx_and_serving_continues(server, name, request_kwargs, expected_status):
    port, _, process = server
    status, body = call(port, "POST", "/v1/models/tiny:predict", **request_kwargs)
    assert status == expected_status, (name, body)
    assert "error" in body
    assert process.poll() is None
    assert good_request_succeeds(port)


def test_odd_json_is_named(server):
    port, _, _ = server
    assert call(port, "POST", "/v1/models/tiny:predict", raw=b"[" * 100000 + b"]" * 100000) == (
        400, {"error": "The body's JSON is nested too deeply."})
    assert call(port, "POST", "/v1/models/tiny:predict", {"signature_name": ["generate"], **GOOD}) == (
        400, {"error": "Unknown signature_name ['generate']; this model has ['beam_search', 'beam_search_text', 'generate', 'generate_text', 'serving_default']."})
    assert call(port, "POST", "/v1/models/tiny:predict", {"inputs": {"token_ids": [[True, False]]}}) == (
        400, {"error": "Input 'token_ids' must hold numbers of dtype int32 (rows of equal length)."})
    assert call(port, "POST", "/v1/models/tiny:predict", raw=b'{"signature_name": "generate_text", "inputs": {"text": ["ab\\ud800"]}}') == (
        400, {"error": "Input 'text' must hold strings of Unicode characters."})
    # TF Serving drops keys it does not read: an option beside "inputs" would be answered without it.
    assert call(port, "POST", "/v1/models/tiny:predict", {"signature_name": "generate", "instances": [[5, 6]], "temperature": 1.0}) == (
        400, {"error": 'Unknown keys [\'temperature\'] in the request; it holds "signature_name" and "instances" or "inputs".'
              " ['temperature'] are inputs of 'generate': put them in \"inputs\" (or in each instance)."})
    assert call(port, "POST", "/v1/models/tiny:predict", {**GOOD, "instance": [[5]]}) == (
        400, {"error": 'Unknown keys [\'instance\'] in the request; it holds "signature_name" and "instances" or "inputs".'})


@pytest.mark.parametrize("name,request_body,message", [
    ("longer than the position table", {"inputs": {"token_ids": [[5] * 129], "padding_mask": [[1] * 129]}},
     "`token_ids` must fit the learned positions: at most 128 tokens (max_sequence_length=128)."),
    ("a prompt of padding only", {"signature_name": "generate", "inputs": {
        "token_ids": [[5, 6], [7, 8]], "padding_mask": [[1, 1], [0, 0]], "max_new_tokens": 2, **GENERATION}},
     "Each prompt needs at least one token; a row of `padding_mask` has none."),
    ("empty text", {"signature_name": "generate_text", "inputs": {"text": ["abc", ""], "max_new_tokens": 2, **GENERATION}},
     "Each `text` needs at least one token."),
    ("a character the char tokenizer cannot represent", {"signature_name": "generate_text", "inputs": {"text": ["abc", "café"]}},
     "Each `text` must use only characters in the vocabulary of the char tokenizer (code points below 107)."),
    ("negative temperature", {"signature_name": "generate_text", "inputs": {"text": ["abc"], "temperature": -0.5}},
     "`temperature` must be a finite number >= 0."),
    # Python's JSON reads Infinity and NaN; sampling at either would draw garbage.
    ("infinite temperature", {"signature_name": "generate", "inputs": {"token_ids": [[5]], "temperature": float("inf")}},
     "`temperature` must be a finite number >= 0."),
    ("NaN temperature", {"signature_name": "generate", "inputs": {"token_ids": [[5]], "temperature": float("nan")}},
     "`temperature` must be a finite number >= 0."),
    ("negative top-k", {"signature_name": "generate", "inputs": {"token_ids": [[5]], "temperature": 1.0, "top_k": -1}},
     "`top_k` must be >= 0 (0: all tokens)."),
    ("top-p above 1", {"signature_name": "generate", "inputs": {"token_ids": [[5]], "top_p": 1.5}},
     "`top_p` must be above 0 and at most 1 (1: all tokens)."),
])
def test_requests_the_graph_refuses_get_its_message(server, name, request_body, message):
    # Checked inside the SavedModel (so TF Serving refuses them too); the
    # server answers with the check's message, not "Graph execution error:".
    port, _, process = server
    status, body = call(port, "POST", "/v1/models/tiny:predict", request_body)
    assert (status, body) == (400, {"error": message}), name
    assert process.poll() is None and good_request_succeeds(port)


def test_requests_past_the_size_limits_get_413(server, exported):
    # No request may exhaust the server's memory: 200 rows x (100 + 32 new) tokens pass the default 16384.
    port, _, process = server
    status, body = call(port, "POST", "/v1/models/tiny:predict", {
        "signature_name": "generate", "inputs": {"token_ids": [[5] * 100] * 200, "max_new_tokens": 32}})
    assert (status, body) == (413, {"error": (
        "The request holds 200 rows of up to 100 tokens + 32 new, 26400 tokens; "
        "this server takes at most 16384 (`--max-tokens`).")})
    # Each beam is a row: 20 rows that pass alone do not pass with 8 beams each.
    status, body = call(port, "POST", "/v1/models/tiny:predict", {
        "signature_name": "beam_search", "inputs": {"token_ids": [[5] * 100] * 20, "max_new_tokens": 28, "num_beams": 8}})
    assert (status, body) == (413, {"error": (
        "The request holds 20 rows x 8 beams of up to 100 tokens + 28 new, 20480 tokens; "
        "this server takes at most 16384 (`--max-tokens`).")})
    assert process.poll() is None and good_request_succeeds(port)
    # A text counts a token per byte (an upper bound for every tokenizer), plus two.
    served = ServedModel(exported[1], max_tokens=100, max_answer_values=5000)
    with pytest.raises(RequestError, match="3 rows of up to 32 tokens \\+ 2 new, 102 tokens; .* at most 100") as error:
        served.predict({"signature_name": "generate_text", "inputs": {"text": ["abc", "a" * 30, "b"], "max_new_tokens": 2}})
    assert error.value.status == 413
    # Logits are rows x tokens x vocabulary: 3 x 16 x 107 numbers, past 5000.
    vocab = exported[0].vocab_size
    with pytest.raises(RequestError, match=f"'logits' would hold {3 * 16 * vocab} numbers \\(shape \\(3, 16, {vocab}\\)\\)"):
        served.predict({"inputs": {"token_ids": [[5] * 16] * 3}})
    assert np.asarray(served.predict({"inputs": {"token_ids": [[5] * 16] * 2}})["outputs"]).shape == (2, 16, vocab)
    with pytest.raises(ValueError, match="`max_tokens` must be a positive int, got 0"):
        ServedModel(exported[1], max_tokens=0)


def test_unknown_paths_and_methods(server):
    port, _, _ = server
    assert call(port, "GET", "/v1/models/other")[0] == 404
    assert call(port, "POST", "/v1/models/tiny:classify", GOOD)[0] == 404
    assert call(port, "PUT", "/v1/models/tiny", GOOD)[0] == 405
    assert good_request_succeeds(port)


def test_concurrent_clients_then_clean_sigterm(server):
    from concurrent.futures import ThreadPoolExecutor

    port, _, process = server
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: good_request_succeeds(port), range(32)))
    assert all(results)
    # A client keeping its connection open after a request, and one that sent
    # nothing: the server had waited for them forever on SIGTERM.
    kept_open = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    kept_open.request("POST", "/v1/models/tiny:predict", json.dumps(GOOD).encode())
    assert kept_open.getresponse().read()
    silent = socket.create_connection(("127.0.0.1", port))
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    kept_open.close()
    silent.close()
    assert "Server stopped." in process.stdout.read()


def test_serving_a_folder_without_a_saved_model_is_one_error_line(tmp_path, capsys):
    from kerasformer.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("is not a SavedModel folder (no saved_model.pb); write one with `kerasformer export`.")


def test_a_port_it_cannot_listen_on_and_bad_workers_are_named(tmp_path):
    from kerasformer.serve import ModelHTTPServer, serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # It used to fail with an AttributeError from its own clean-up, hiding why.
        with pytest.raises(ValueError, match=rf"Cannot listen on `host` '127.0.0.1', `port` {port}: .*in use"):
            ModelHTTPServer(("127.0.0.1", port), model=None)
    with pytest.raises(ValueError, match=r"`port` 70000: .*0-65535\.$"):
        ModelHTTPServer(("127.0.0.1", 70000), model=None)
    with pytest.raises(ValueError, match=r"`workers` must be a positive number .* got 0"):
        serve(str(tmp_path), workers=0)
    with pytest.raises(ValueError, match=r"`max_connections` must be a positive int, got 0"):
        serve(str(tmp_path), max_connections=0)
    with pytest.raises(ValueError, match=r"`workers` must be a positive number .* got 0"):
        ModelHTTPServer(("127.0.0.1", 0), model=None, workers=0)  # It had waited forever for a worker.


class BlockingModel:
    """A stand-in for `ServedModel` whose `predict` waits for `release`, counting the calls running at once."""

    name = "fake"

    def __init__(self):
        self.release = threading.Event()
        self.running = 0
        self.most_running = 0
        self.lock = threading.Lock()

    def status(self):
        return {"state": "AVAILABLE"}

    def predict(self, request):
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        self.release.wait(timeout=30)
        with self.lock:
            self.running -= 1
        return {"outputs": request["inputs"]}


@pytest.fixture
def fake_server():
    """A `ModelHTTPServer` of a `BlockingModel` on a free port, in a thread: `(server, model, port)`."""
    from kerasformer.serve import ModelHTTPServer

    def start(**kwargs):
        model = BlockingModel()
        server = ModelHTTPServer(("127.0.0.1", 0), model, **kwargs)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append((server, model))
        return server, model, server.server_address[1]

    started = []
    yield start
    for server, model in started:
        model.release.set()
        server.shutdown()
        server.server_close()


def post_async(port, inputs, timeout=30):
    """POSTs `{"inputs": inputs}` in a thread; `.result()` is `(status, body)`."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    future = pool.submit(call_with_timeout, port, {"inputs": inputs}, timeout)
    pool.shutdown(wait=False)
    return future


def call_with_timeout(port, body, timeout):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    connection.request("POST", "/v1/models/fake:predict", json.dumps(body).encode())
    response = connection.getresponse()
    status, text = response.status, response.read()
    connection.close()
    return status, json.loads(text)


def wait_until(condition, timeout=10):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def test_connections_kept_open_or_silent_do_not_hold_the_model_workers(fake_server):
    # HTTP/1.1 clients (http.client, requests.Session) keep a connection open
    # after their answer. With a worker held per connection, 4 such clients (or
    # 4 that connected and sent nothing) left a server of 4 workers answering
    # no one else.
    server, model, port = fake_server(workers=2)
    model.release.set()
    kept_open = []
    for i in range(3):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("POST", "/v1/models/fake:predict", json.dumps({"inputs": [i]}).encode())
        assert json.loads(connection.getresponse().read()) == {"outputs": [i]}
        kept_open.append(connection)
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    assert call_with_timeout(port, {"inputs": [9]}, timeout=5) == (200, {"outputs": [9]})
    for connection in kept_open:  # Each is still open and served.
        connection.request("POST", "/v1/models/fake:predict", json.dumps({"inputs": [7]}).encode())
        assert json.loads(connection.getresponse().read()) == {"outputs": [7]}
        connection.close()
    for connection in silent:
        connection.close()


def test_at_most_workers_requests_run_the_model_at_once(fake_server):
    server, model, port = fake_server(workers=2)
    answers = [post_async(port, [i]) for i in range(5)]
    wait_until(lambda: model.running == 2)
    time.sleep(0.2)  # The other three wait for a worker.
    assert model.running == 2
    model.release.set()
    assert [a.result() for a in answers] == [(200, {"outputs": [i]}) for i in range(5)]
    assert model.most_running == 2


def test_shutdown_finishes_requests_in_progress_and_closes_idle_connections(fake_server):
    server, model, port = fake_server()
    idle = socket.create_connection(("127.0.0.1", port))
    answer = post_async(port, [1])
    wait_until(lambda: model.running == 1)
    server.shutdown()
    closing = threading.Thread(target=server.server_close)
    closing.start()
    time.sleep(0.3)
    assert closing.is_alive()  # It waits for the request in progress...
    model.release.set()
    assert answer.result() == (200, {"outputs": [1]})  # ...which is answered,
    closing.join(timeout=10)
    assert not closing.is_alive()
    idle.settimeout(10)
    assert idle.recv(1) == b""  # and the idle connection is closed.
    idle.close()


def test_connections_past_the_limit_wait_to_be_accepted(fake_server):
    server, model, port = fake_server(max_connections=2)
    model.release.set()
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    wait_until(lambda: len(server._connections) == 2)
    answer = post_async(port, [1])
    time.sleep(0.5)
    assert not answer.done() and len(server._connections) == 2  # Waiting in the listen backlog...
    held[0].close()
    assert answer.result(timeout=10) == (200, {"outputs": [1]})  # ...until a connection closes.
    held[1].close()


def test_a_body_that_stops_arriving_gets_408_and_frees_the_connection(fake_server, monkeypatch):
    from kerasformer import serve

    monkeypatch.setattr(serve._Handler, "timeout", 0.5)
    server, model, port = fake_server()
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(b"POST /v1/models/fake:predict HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"inputs\"")
        client.settimeout(10)
        answer = b""
        while chunk := client.recv(4096):  # The server answers, then closes.
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert answer.endswith(b'{"error": "The request body did not arrive within 0.5 s."}')
    wait_until(lambda: not server._connections)
