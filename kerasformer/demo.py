"""The main job, end to end and offline: build, train, export, serve.

    python -m kerasformer.demo

1. builds a small GPT (the `gpt2-tiny` preset);
2. trains it on a generated English-like language (KerasHub char tokenizer,
   AdamW with warm-up and cosine decay, checkpoints, a CSV log and a loss plot
   in `runs/demo`) and reports validation loss and perplexity;
3. exports it as a TensorFlow SavedModel in `saved_models/demo`, with
   `serving_default`, `generate` and `generate_text` signatures;
4. serves it on 127.0.0.1 with TF Serving's REST API and asks it for text,
   as any TF Serving client would, then stops the server.

A few minutes on 2 CPU cores, on any Keras backend (`KERAS_BACKEND`).
"""

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time

from kerasformer.train import TrainConfig, train


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port, path, body):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--run-dir", default="runs/demo")
    parser.add_argument("--export-dir", default="saved_models/demo")
    args = parser.parse_args(argv)

    import keras

    print(f"[1/4] Building gpt2-tiny on the {keras.backend.backend()} backend.", flush=True)
    print("[2/4] Training on a generated language.", flush=True)
    results = train(TrainConfig(
        task="gpt", run_dir=args.run_dir, steps=args.steps, checkpoint_every=max(args.steps // 3, 1),
        batch_size=32, sequence_length=64, learning_rate=3e-3, warmup_steps=min(50, args.steps // 2),
    ))

    from kerasformer.export import export_run

    print(f"[3/4] Exporting a SavedModel to {args.export_dir}.", flush=True)
    path = export_run(args.run_dir, args.export_dir)

    print("[4/4] Serving it over TF Serving's REST API.", flush=True)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "kerasformer.cli", "serve", path, "--port", str(port), "--name", "demo"],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while True:
            try:
                status, reply = _post(port, "/v1/models/demo:predict", {
                    "signature_name": "generate_text",
                    "inputs": {"text": ["the old cat", "some robots"], "max_new_tokens": 40},  # Greedy by default.
                })
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError("The server did not start.") from None
                time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(timeout=30)
    if status != 200:
        raise RuntimeError(f"The server answered {status}: {reply}")
    for text in reply["outputs"]:
        print(f"  served: {text!r}")
    print("demo done: " + ", ".join(f"{k}={v}" for k, v in results.items()), flush=True)
    return results


if __name__ == "__main__":
    main()
