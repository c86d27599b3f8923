"""`make run`: start the whole service on this machine and quantize the bundled sample model.

    python -m launcher [--port 8000] [--once]

Embedded defaults: SQLite and artifacts under ./var, Redis at 127.0.0.1:6379 when it answers,
otherwise kombu's filesystem broker. Set DATABASE_URL / BROKER_URL to use PostgreSQL / Redis.

SIGTERM, SIGINT or SIGHUP stops every process it started (`Stack.stop`), then ends the launcher by
that signal. A port that another process listens on is refused ("address in use"), status 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from jobs.config import settings
from jobs.queue import resolve_broker_url
from launcher.stack import ROOT, Stack, StartError, Stopped


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("QUANT_PORT", "8000")))
    parser.add_argument("--once", action="store_true", help="stop the service after the sample job")
    args = parser.parse_args()
    # The commands it runs write to the same output: a line of its own is out before they start, even
    # where that output is a file or a pipe.
    sys.stdout.reconfigure(line_buffering=True)

    var_dir = Path(os.environ.get("QUANT_VAR_DIR", ROOT / "var")).resolve()
    env = dict(os.environ, QUANT_VAR_DIR=str(var_dir))
    # Every process must agree on one broker: decide once, here.
    env["BROKER_URL"] = resolve_broker_url(settings)
    env.setdefault("DATABASE_URL", settings.resolved_database_url)
    stack = Stack(env=env, log_dir=var_dir / "logs")
    print(f"database: {env['DATABASE_URL']}\nbroker:   {env['BROKER_URL']}\nlogs:     {stack.log_dir}")
    stack.raise_on_signals()
    try:
        stack.migrate()
        # With a GPU and TensorRT here, the job worker also takes the `engine` queue and builds engines itself.
        probe = stack.run("capabilities", [sys.executable, "-m", "worker.capabilities"], capture=True, check=False)
        capable = '"engine_capable": true' in probe.stdout
        print(f"engine:   {'TensorRT engines built on this GPU' if capable else 'no GPU with TensorRT here: skipped'}")
        # kombu's filesystem broker creates a new exchange's table file before it locks it: two workers binding
        # to one at once can read it empty and die (JSONDecodeError), so there the second starts once the first
        # is ready. Redis has no such window.
        one_by_one = env["BROKER_URL"].startswith("filesystem")
        stack.start_worker("gpu", "gpu,engine" if capable else "gpu", wait=one_by_one)
        stack.start_worker("default", "default", beat=True)
        url = stack.start_api(args.port)
        print(f"API:      {url}  (OpenAPI docs at {url}/docs)")
        create_key = [sys.executable, "-m", "jobs.admin", "create-key", "--project", "demo", "--name", "make run"]
        key = stack.run("create-key", create_key, capture=True).stdout.strip()
        print(f"API key:  {key}  (project 'demo')")
        sample_dir = var_dir / "sample"
        model, data = sample_dir / "model.onnx", sample_dir / "heldout.npz"  # never seen in training
        if not (model.exists() and data.exists()):
            print("building the sample model (a small CNN trained on scikit-learn's digits)...")
            stack.run("sample", [sys.executable, "-m", "samples.digits", str(sample_dir)])
        out_dir = sample_dir / "out"
        quantize = [sys.executable, "-m", "cli.quantctl", "quantize", str(model), str(data), "-o", str(out_dir)]
        done = stack.run("quantize", quantize, env={"QUANT_API_URL": url, "QUANT_API_KEY": key}, check=False)
        if done.returncode != 0:
            print(f"the sample job did not succeed; see {stack.log_dir}", file=sys.stderr)
            return done.returncode
        print(f"\nartifacts: {out_dir}\nreport:    {out_dir / 'report.json'}")
        if args.once:
            return 0
        print("\nthe service keeps running; Ctrl-C stops it")
        while all(p.poll() is None for p in stack.processes.values()):
            time.sleep(1)
        print("a service process exited; stopping", file=sys.stderr)
        return 1
    except StartError as error:
        print(f"launcher: {error}", file=sys.stderr)
        return 1
    finally:
        stack.stop()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Stopped as stopped:
        # Its processes are stopped (`main`'s `finally`): end by the signal itself, as a process that
        # does not catch it would, so that the caller sees "killed by SIGTERM" (a shell: status 143).
        signal.signal(stopped.signum, signal.SIG_DFL)
        signal.raise_signal(stopped.signum)
