"""An HTTP server for a SavedModel that speaks TensorFlow Serving's REST API.

    kerasformer serve saved_models/gpt --port 8501

    GET  /v1/models/NAME                 model status
    GET  /v1/models/NAME/metadata        signatures, their inputs and outputs
    POST /v1/models/NAME:predict         {"signature_name": ..., "instances": [...]}  (row format)
                                         {"signature_name": ..., "inputs": {...}}     (columnar format)

Answers are TF Serving's: `{"predictions": [...]}` for rows, `{"outputs": ...}`
for columns, `{"error": "..."}` with a 4xx status for a bad request. A client
written for TF Serving works unchanged, and the same folder can be served by
`tensorflow_model_server` in production. Each connection has a thread of
its own (up to `max_connections`) and at most `workers` requests run the
model at once; a connection silent for `CONNECTION_TIMEOUT_S` is closed, so
neither idle keep-alive clients nor stalled ones hold the model's workers.
SIGTERM finishes the requests in progress and stops the server, even while
clients keep connections open. Only TensorFlow is needed here.
A request of more tokens than `max_tokens`, or whose answer would hold more
numbers than `max_answer_values`, gets 413 before it runs, so that one
request cannot take all the server's memory.

Unlike TF Serving, which needs every input, this server fills in what a
request leaves out where the default is plain: the generation options from
the export's `kerasformer.json` (greedy, 32 new tokens, no top-k / top-p, no
stop token, seed 0; 4 beams and a length penalty of 1 for beam search), a padding mask (ones, or, for rows of token ids of
different lengths, the mask of those rows padded with 0) and segment ids of
zeros. So `{"signature_name": "generate_text", "inputs": {"text": ["ROMEO:"]}}`
and `{"signature_name": "generate", "instances": [[5, 6, 7], [8]]}` are whole
requests. Also unlike TF Serving, which drops keys it does not read, a key
beside "signature_name", "instances" and "inputs" is refused by name: an
option put there would otherwise be answered as if it were left out.
"""

import json
import os
import signal
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np

from kerasformer.checks import check_positive_int

MAX_REQUEST_BYTES = 8 * 1024 * 1024
# A connection that sends nothing for this long, between requests (HTTP/1.1
# keeps connections open) or within one, is closed: it holds a thread.
CONNECTION_TIMEOUT_S = 30
DEFAULT_MAX_CONNECTIONS = 256
# A request's work is bounded so that no request can exhaust the server's
# memory (the OS would kill it): its tokens, rows x (longest input + new
# tokens), bound activations and caches; its answer's numbers bound the
# logits and their JSON (~30 bytes a number while written). Attention scores
# grow with the square of a row: a model without a learned position table
# (T5, rotary) serving long rows may want a lower `max_tokens`.
DEFAULT_MAX_TOKENS = 16384
DEFAULT_MAX_ANSWER_VALUES = 2**25
# List inputs that are one option of the whole request, not a value per row; empty is a choice (no stop token).
REQUEST_LISTS = ("stop_token_ids",)
_DTYPE_NAMES = {"int32": "DT_INT32", "int64": "DT_INT64", "float32": "DT_FLOAT", "string": "DT_STRING", "bool": "DT_BOOL"}


class RequestError(ValueError):
    """A bad request: answered with `status` and a JSON error, never raised further."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


class ServedModel:
    """A loaded SavedModel, its signatures, and request validation."""

    def __init__(self, path, name=None, max_tokens=DEFAULT_MAX_TOKENS, max_answer_values=DEFAULT_MAX_ANSWER_VALUES):
        import tensorflow as tf

        check_positive_int("max_tokens", max_tokens)
        check_positive_int("max_answer_values", max_answer_values)
        self.max_tokens, self.max_answer_values = max_tokens, max_answer_values

        try:  # WordPiece / SentencePiece ops used by text signatures.
            import tensorflow_text  # noqa: F401
        except ImportError:
            pass
        self.tf = tf
        self.path = os.path.abspath(path)
        self.name = name or os.path.basename(self.path.rstrip("/"))
        if not os.path.isfile(os.path.join(self.path, "saved_model.pb")):
            raise ValueError(f"{path!r} is not a SavedModel folder (no saved_model.pb); write one with `kerasformer export`.")
        self.module = tf.saved_model.load(self.path)
        self.signatures = dict(self.module.signatures)
        info_path = os.path.join(self.path, "kerasformer.json")
        self.vocab_size = None
        self.defaults = {}  # Input name -> value for a request that leaves it out.
        if os.path.isfile(info_path):
            with open(info_path) as f:
                info = json.load(f)
            config = info.get("config", {})
            config = config.get("backbone", {}).get("config", config) if isinstance(config.get("backbone"), dict) else config
            self.vocab_size = config.get("vocab_size")
            self.defaults = info.get("defaults", {})

    # Metadata ---------------------------------------------------------------

    def status(self):
        return {"model_version_status": [{"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}

    def metadata(self):
        def describe(specs):
            return {
                name: {
                    "dtype": _DTYPE_NAMES.get(spec.dtype.name, spec.dtype.name),
                    "tensor_shape": {"dim": [{"size": str(-1 if d is None else d), "name": ""} for d in spec.shape]},
                    "name": f"{name}:0",
                }
                for name, spec in specs.items()
            }

        signature_def = {}
        for name, function in self.signatures.items():
            signature_def[name] = {
                "inputs": describe(function.structured_input_signature[1]),
                "outputs": describe(function.structured_outputs),
                "method_name": "tensorflow/serving/predict",
            }
        return {
            "model_spec": {"name": self.name, "signature_name": "", "version": "1"},
            "metadata": {"signature_def": {"signature_def": signature_def}},
        }

    # Prediction -------------------------------------------------------------

    def predict(self, request):
        if not isinstance(request, dict):
            raise RequestError("The request body must be a JSON object.")
        signature_name = request.get("signature_name", "serving_default")
        if not isinstance(signature_name, str) or signature_name not in self.signatures:
            raise RequestError(f"Unknown signature_name {signature_name!r}; this model has {sorted(self.signatures)}.")
        function = self.signatures[signature_name]
        specs = function.structured_input_signature[1]
        # TF Serving reads only these keys and drops the rest: a "temperature" put beside
        # "inputs" would be a greedy answer to a request for sampling.
        stray = sorted(set(request) - {"signature_name", "instances", "inputs"})
        if stray:
            inputs = [key for key in stray if key in specs]
            raise RequestError(
                f"Unknown keys {stray} in the request; it holds \"signature_name\" and \"instances\" or \"inputs\"."
                + (f" {inputs} are inputs of {signature_name!r}: put them in \"inputs\" (or in each instance)." if inputs else ""))
        rows = "instances" in request
        if rows == ("inputs" in request):
            raise RequestError('The request needs exactly one of "instances" (row format) or "inputs" (columnar format).')
        columns = self._columns_from_instances(request["instances"], specs) if rows else request["inputs"]
        if not isinstance(columns, dict):
            only = self._required(specs)
            if len(only) != 1:
                raise RequestError(f"Name the inputs of {signature_name!r}: {sorted(specs)}.")
            columns = {only[0]: columns}
        unknown = set(columns) - set(specs)
        if unknown:
            raise RequestError(f"Unknown inputs {sorted(unknown)}; {signature_name!r} takes {sorted(specs)}.")
        missing = set(self._required(specs)) - set(columns)
        missing |= {name for name in specs if _like(name) in missing}
        if missing:
            raise RequestError(f"Missing inputs {sorted(missing)} for {signature_name!r}.")
        for name in specs:
            if name.endswith("padding_mask") and name not in columns:
                columns = _padded(columns, _like(name), name)
        tensors = {name: self._tensor(name, columns[name], spec) for name, spec in specs.items() if name in columns}
        for name, spec in specs.items():  # Left out: the plain default.
            if name in tensors:
                continue
            if name in self.defaults:
                tensors[name] = self._tensor(name, self.defaults[name], spec)
            else:  # A padding mask of ones (no padding), segment ids of zeros, shaped as the ids.
                fill = self.tf.ones_like if name.endswith("padding_mask") else self.tf.zeros_like
                tensors[name] = fill(tensors[_like(name)])
        self._check_size(function, tensors)
        outputs = {k: v.numpy() for k, v in function(**tensors).items()}
        if rows:
            return {"predictions": _rows(outputs)}
        if len(outputs) == 1:
            return {"outputs": _jsonable(next(iter(outputs.values())))}
        return {"outputs": {k: _jsonable(v) for k, v in outputs.items()}}

    def _check_size(self, function, tensors):
        """Refuses (413) a request past `max_tokens` or whose answer would pass `max_answer_values`."""
        rows, length = 0, 0  # length: the tokens of a row, summed over its inputs (encoder + decoder)
        for name, tensor in tensors.items():
            if tensor.dtype == self.tf.string and tensor.shape.rank == 1:  # A text has at most a token per byte (+ [CLS], [SEP]).
                texts = tensor.numpy()
                rows, length = max(rows, len(texts)), length + max((len(t) for t in texts), default=0) + 2
            elif name.endswith("token_ids") and tensor.shape.rank == 2:
                rows, length = max(rows, tensor.shape[0]), length + tensor.shape[1]
        new = int(tensors["max_new_tokens"]) if "max_new_tokens" in tensors else 0
        beams = max(int(tensors["num_beams"]), 1) if "num_beams" in tensors else 1  # Each beam is a row of its own.
        tokens = rows * beams * (length + new)
        if tokens > self.max_tokens:
            raise RequestError(
                f"The request holds {rows} rows{f' x {beams} beams' if beams > 1 else ''} of up to {length} tokens"
                f"{f' + {new} new' if new else ''}, {tokens} tokens; this server takes at most {self.max_tokens} (`--max-tokens`).", 413)
        for name, spec in function.structured_outputs.items():
            # Unknown dimensions: rows first, then the tokens of a row.
            shape = [rows if i == 0 else (length + new if d is None else d) for i, d in enumerate(spec.shape.as_list())]
            if int(np.prod(shape)) > self.max_answer_values:
                raise RequestError(
                    f"The answer's {name!r} would hold {int(np.prod(shape))} numbers (shape {tuple(shape)}); this server "
                    f"sends at most {self.max_answer_values} (`--max-answer-values`). Ask for fewer rows or tokens.", 413)

    def _columns_from_instances(self, instances, specs):
        if not isinstance(instances, list) or not instances:
            raise RequestError('"instances" must be a non-empty list.')
        if not all(isinstance(i, dict) for i in instances):
            only = self._required(specs)
            if len(only) != 1:
                raise RequestError(f"Each instance must be an object with the inputs {sorted(specs)}.")
            return {only[0]: instances}
        columns = {}
        for name, spec in specs.items():
            values = [instance.get(name) for instance in instances]
            if all(v is None for v in values):  # Left out: `predict` fills in a default or says it is missing.
                continue
            if any(v is None for v in values):
                raise RequestError(f"Every instance needs the input {name!r}, or none (its default).")
            if _per_request(name, spec):  # An option of the whole request: all rows must agree.
                if any(v != values[0] for v in values):
                    raise RequestError(f"The input {name!r} must be the same in every instance.")
                columns[name] = values[0]
            else:
                columns[name] = values
        extra = {k for instance in instances for k in instance} - set(specs)
        if extra:
            raise RequestError(f"Unknown inputs {sorted(extra)}; this signature takes {sorted(specs)}.")
        return columns

    def _required(self, specs):
        """The inputs a request must give: those without a default."""
        return [name for name in specs if name not in self.defaults and _like(name) is None]

    def _tensor(self, name, value, spec):
        tf = self.tf
        dtype = spec.dtype
        try:
            if dtype == tf.string:
                array = np.asarray(value, dtype=object)
                if array.size and not all(isinstance(v, str) for v in array.ravel()):
                    raise ValueError
                for text in array.ravel():
                    text.encode("utf-8")  # JSON may hold a lone surrogate ("\ud800"), which is no character.
            else:
                array = np.asarray(value)
                if array.dtype == object or array.dtype.kind not in ("iuf" if dtype != tf.bool else "iufb"):
                    raise ValueError  # Strings, nested objects, and true/false for a number.
                if dtype.is_integer and array.size and array.dtype.kind == "f" and not np.all(array == np.round(array)):
                    raise ValueError  # 1.5, NaN, infinity
        except (ValueError, TypeError):
            kind = "strings of Unicode characters" if dtype == tf.string else f"numbers of dtype {dtype.name} (rows of equal length)"
            raise RequestError(f"Input {name!r} must hold {kind}.") from None
        if dtype.is_integer and array.size:  # Past the dtype's range a cast would wrap: seed 2**32 + 7 would be seed 7.
            info = np.iinfo(dtype.as_numpy_dtype)
            if array.min() < info.min or array.max() > info.max:
                raise RequestError(f"Input {name!r} must hold {dtype.name} numbers, in [{info.min}, {info.max}].")
        if dtype != tf.string:
            array = array.astype(dtype.as_numpy_dtype)
        if array.ndim != spec.shape.rank:
            raise RequestError(f"Input {name!r} must have rank {spec.shape.rank} (shape {spec.shape}), got shape {array.shape}.")
        if array.ndim and array.size == 0 and name not in REQUEST_LISTS:
            raise RequestError(f"Input {name!r} is empty.")
        if name.endswith(("token_ids", "token_id")) and self.vocab_size and array.size and (array.min() < 0 or array.max() >= self.vocab_size):
            raise RequestError(f"Input {name!r} has token ids outside [0, {self.vocab_size}) (vocab_size={self.vocab_size}).")
        if name == "max_new_tokens" and not 1 <= int(array) <= 4096:
            raise RequestError("Input 'max_new_tokens' must be in [1, 4096].")
        if array.ndim == 2 and "padding_mask" in name and array.shape[1] == 0:
            raise RequestError(f"Input {name!r} is empty.")
        return tf.constant(array, dtype=dtype)


def _like(name):
    """The ids input whose shape a left-out mask or segment input takes."""
    if name.endswith("padding_mask"):
        return name.replace("padding_mask", "token_ids")
    return "token_ids" if name == "segment_ids" else None


def _padded(columns, ids_name, mask_name):
    """`columns` with rows of ids of different lengths padded with 0, and their padding mask.

    Only for a request that leaves the mask out; rows of one length keep the
    mask of ones. Anything but a list of lists of numbers is left for
    `_tensor` to refuse.
    """
    rows = columns.get(ids_name)
    if not (isinstance(rows, list) and rows and all(isinstance(row, list) for row in rows)):
        return columns
    length = max(len(row) for row in rows)
    if all(len(row) == length for row in rows) or not all(isinstance(t, (int, float)) for row in rows for t in row):
        return columns
    ids = [row + [0] * (length - len(row)) for row in rows]
    mask = [[1] * len(row) + [0] * (length - len(row)) for row in rows]
    return {**columns, ids_name: ids, mask_name: mask}


def _per_request(name, spec):
    """Whether an input is an option of the whole request (not one value per row)."""
    return spec.shape.rank == 0 or name in REQUEST_LISTS


def _error_message(error):
    """The line of a (TensorFlow) error that says what went wrong.

    A graph's error starts "Graph execution error:", then the node and where
    it was defined; the op's own message (an assertion's text) comes last.
    """
    lines = [line.strip() for line in str(error).splitlines()]
    for line in lines:
        if line.startswith("assertion failed: ["):  # "assertion failed: [text] [Condition x <= y ...] [x = ] [9] ..."
            return line[len("assertion failed: ["):].split("] [", 1)[0].removesuffix("]")
    if lines and lines[0].startswith("Graph execution error"):
        lines = [line for line in lines if line and not line.startswith("[[")]  # "[[{{node ...}}]] [Op: ...]"
        return lines[-1]
    return lines[0] if lines and lines[0] else type(error).__name__


def _jsonable(array):
    array = np.asarray(array)
    if array.dtype == object:
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in array.tolist()] if array.ndim else array.item().decode()
    return array.tolist()


def _rows(outputs):
    if len(outputs) == 1:
        return _jsonable(next(iter(outputs.values())))
    columns = {k: _jsonable(v) for k, v in outputs.items()}
    count = len(next(iter(columns.values())))
    return [{k: columns[k][i] for k in columns} for i in range(count)]


class _Handler(BaseHTTPRequestHandler):
    server_version = "kerasformer-serve"
    protocol_version = "HTTP/1.1"
    timeout = CONNECTION_TIMEOUT_S  # Of each read and write on the connection.

    def handle_one_request(self):
        # A request runs from its first line to its answer: the server's
        # shutdown waits for those, and closes connections between them.
        self.in_request = False
        try:
            super().handle_one_request()
        finally:
            if self.in_request:
                self.server.end_request(self.connection)
            if self.server.stopping.is_set():
                self.close_connection = True

    def parse_request(self):  # Called once a request line has arrived.
        self.in_request = True
        self.server.begin_request(self.connection)
        return super().parse_request()

    def log_message(self, format, *args):  # Quiet by default; errors are answered, not printed.
        if os.environ.get("KERASFORMER_SERVE_LOG"):
            super().log_message(format, *args)

    def _reply(self, status, body):
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _route(self):
        model = self.server.model
        prefix = f"/v1/models/{model.name}"
        path = self.path.split("?")[0]
        if not path.startswith(prefix):
            raise RequestError(f"Not found: {path}; this server has /v1/models/{model.name}.", 404)
        return path[len(prefix):]

    def do_GET(self):
        try:
            rest = self._route()
            if rest in ("", "/", "/versions/1"):
                return self._reply(200, self.server.model.status())
            if rest in ("/metadata", "/versions/1/metadata"):
                return self._reply(200, self.server.model.metadata())
            raise RequestError(f"Not found: {self.path}.", 404)
        except RequestError as error:
            self._reply(error.status, {"error": str(error)})

    def do_POST(self):
        body = None
        try:
            rest = self._route()
            if rest not in (":predict", "/versions/1:predict"):
                raise RequestError(f"Not found: {self.path}; POST to /v1/models/{self.server.model.name}:predict.", 404)
            length = self.headers.get("Content-Length")
            if length is None:
                raise RequestError("A Content-Length header is required.", 411)
            if not length.strip().isdecimal():  # A negative length would read until the client hangs up.
                raise RequestError(f"The Content-Length header must be a number of bytes, got {length!r}.")
            length = int(length)
            if length > MAX_REQUEST_BYTES:
                raise RequestError(f"The request is larger than {MAX_REQUEST_BYTES} bytes.", 413)
            body = self.rfile.read(length)
            try:
                request = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise RequestError(f"The body is not valid JSON: {error}.") from None
            except RecursionError:  # Thousands of nested arrays: no input of a model is that deep.
                raise RequestError("The body's JSON is nested too deeply.") from None
            with self.server.model_workers:  # At most `workers` requests run the model at once.
                answer = self.server.model.predict(request)
            self._reply(200, answer)
        except TimeoutError:  # The client stopped sending its body; what was read is not a request.
            self.close_connection = True
            self._reply(408, {"error": f"The request body did not arrive within {self.timeout} s."})
        except RequestError as error:
            # A body left unread would be read as the next request: close instead.
            self.close_connection = body is None
            self._reply(error.status, {"error": str(error)})
        except ValueError as error:
            self._reply(400, {"error": str(error)})
        except Exception as error:  # noqa: BLE001 - a server answers, it does not crash.
            self._reply(400 if "InvalidArgument" in type(error).__name__ else 500, {"error": _error_message(error)[:500]})

    def do_PUT(self):
        self._reply(405, {"error": "Use GET for status and metadata, POST for :predict."})

    do_DELETE = do_PUT


class ModelHTTPServer(HTTPServer):
    """Serves each connection on a thread of its own; at most `workers` requests run the model at once.

    A thread per connection (up to `max_connections`; more wait to be
    accepted) keeps a client that holds its connection open between requests, as
    HTTP/1.1 clients do, from taking a model worker while it sends nothing.
    `server_close` waits for the requests in progress and closes the idle
    connections.
    """

    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128  # The listen backlog, where connections past `max_connections` wait.

    def __init__(self, address, model, workers=4, max_connections=DEFAULT_MAX_CONNECTIONS):
        check_workers(workers)  # 0 would leave every request waiting for a worker.
        check_positive_int("max_connections", max_connections)
        self.model = model
        self.model_workers = threading.BoundedSemaphore(workers)
        self.max_connections = max_connections
        self.stopping = threading.Event()
        self._lock = threading.Condition()
        self._connections = {}  # socket -> whether a request is in progress on it
        try:
            super().__init__(address, _Handler)
        except (OSError, OverflowError) as error:  # Port taken or out of range, unknown host.
            raise ValueError(f"Cannot listen on `host` {address[0]!r}, `port` {address[1]}: {str(error).rstrip('.')}.") from None

    def process_request(self, request, client_address):
        with self._lock:
            # At the limit, stop accepting: the next connections wait in the
            # listen backlog, as with nginx or gunicorn, until one closes.
            # (A 503 answered at once raced the client sending its request:
            # the client could see a broken pipe rather than the answer.)
            while len(self._connections) >= self.max_connections and not self.stopping.is_set():
                self._lock.wait(timeout=1.0)
            accepted = not self.stopping.is_set()
            if accepted:
                self._connections[request] = False
        if accepted:
            try:
                return threading.Thread(target=self._handle, args=(request, client_address), daemon=True).start()
            except RuntimeError:  # No thread to be had: the client may try again.
                with self._lock:
                    self._connections.pop(request, None)
        self.shutdown_request(request)

    def _handle(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - a broken connection must not stop the server.
            self.handle_error(request, client_address)
        finally:
            with self._lock:
                self._connections.pop(request, None)
                self._lock.notify_all()
            self.shutdown_request(request)

    def handle_error(self, request, client_address):  # Quiet, as the handler's log is.
        if os.environ.get("KERASFORMER_SERVE_LOG"):
            super().handle_error(request, client_address)

    def begin_request(self, connection):
        with self._lock:
            self._connections[connection] = True

    def end_request(self, connection):
        with self._lock:
            if connection in self._connections:
                self._connections[connection] = False
            self._lock.notify_all()

    def shutdown(self):
        self.stopping.set()  # Releases an accept waiting for a free connection.
        with self._lock:
            self._lock.notify_all()
        super().shutdown()

    def server_close(self):
        """Stops accepting, waits for the requests in progress, and closes every connection."""
        self.stopping.set()
        super().server_close()
        with self._lock:
            while True:
                for connection, busy in self._connections.items():
                    if not busy:  # Waiting for a request that would not be served: wake its thread.
                        _close_reading(connection)
                if not any(self._connections.values()):
                    break
                self._lock.wait(timeout=1.0)


def check_workers(workers):
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"`workers` must be a positive number of requests served at once, got {workers!r}.")


def _close_reading(connection):
    try:
        connection.shutdown(socket.SHUT_RD)
    except OSError:  # Already closed by the client.
        pass


def serve(path, host="127.0.0.1", port=8501, name=None, workers=4, ready=None,
          max_tokens=DEFAULT_MAX_TOKENS, max_answer_values=DEFAULT_MAX_ANSWER_VALUES,
          max_connections=DEFAULT_MAX_CONNECTIONS):
    """Serves the SavedModel at `path` until SIGTERM or SIGINT.

    `workers` requests run the model at once, on up to `max_connections`
    open connections. `max_tokens` bounds a request's rows x (longest input
    + new tokens), and `max_answer_values` the numbers of its answer; larger
    requests get 413.
    """
    check_workers(workers)
    check_positive_int("max_connections", max_connections)
    model = ServedModel(path, name, max_tokens, max_answer_values)
    server = ModelHTTPServer((host, port), model, workers, max_connections)

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    print(f"Serving {model.name} ({sorted(model.signatures)}) on http://{host}:{server.server_address[1]}/v1/models/{model.name}", flush=True)
    if ready is not None:
        ready.set()
    try:
        server.serve_forever()
    finally:
        server.server_close()
        print("Server stopped.", flush=True)
