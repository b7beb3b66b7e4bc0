"""Load on the REST server: N concurrent clients, a fixed count of requests, on loopback.

Exports a small GPT, serves it in a subprocess on 127.0.0.1, and sends
`--requests` predict calls (row format, 4 x 32 tokens each) from `--clients`
threads. Prints requests/s, p50 / p99 latency and the error count (must be 0).

    python benchmarks/serve_load.py [--clients 8] [--requests 400]
"""

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    import numpy as np

    from kerasformer.export import export
    from kerasformer.models import from_preset

    with tempfile.TemporaryDirectory() as folder:
        path = export(from_preset("gpt2-tiny"), os.path.join(folder, "gpt"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "-m", "kerasformer.cli", "serve", path, "--port", str(port), "--workers", str(args.workers)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            body = json.dumps({"instances": [{"token_ids": list(range(1, 33)), "padding_mask": [1] * 32}] * 4})

            def request(_):
                start = time.perf_counter()
                try:
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                    connection.request("POST", "/v1/models/gpt:predict", body=body, headers={"Content-Type": "application/json"})
                    response = connection.getresponse()
                    response.read()
                    connection.close()
                    ok = response.status == 200
                except OSError:
                    ok = False
                return ok, time.perf_counter() - start

            deadline = time.time() + 120
            while time.time() < deadline and not request(0)[0]:
                time.sleep(0.5)
            for _ in range(10):  # Warm-up.
                request(0)
            start = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                results = list(pool.map(request, range(args.requests)))
            seconds = time.perf_counter() - start
        finally:
            server.terminate()
            server.wait(timeout=30)
    latencies = np.array([t for _, t in results]) * 1000
    errors = sum(not ok for ok, _ in results)
    print(
        f"{args.clients} clients, {args.requests} requests: {args.requests / seconds:.1f} requests/s, "
        f"p50 {np.percentile(latencies, 50):.1f} ms, p99 {np.percentile(latencies, 99):.1f} ms, errors {errors}"
    )
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
