"""`quantctl`: the command-line client of the quantization service.

It speaks HTTP only (httpx) and imports nothing else of the project, so it can be installed and
used on a machine that has no torch, no database and no queue.

    quantctl.py   argparse, one function per subcommand, exit codes
    client.py     `Client` (base URL, API key, JSON, cursor pagination) and `ApiError` (problem+json)
    sse.py        Server-Sent Events parser and a stream that resumes with Last-Event-ID
    watch.py      a job's events drawn as a progress bar with log lines above it
    transfer.py   uploads with a progress bar; downloads to `.part` files resumed with Range
    recipe.py     a recipe from a JSON file plus `--set a.b=value` overrides
    report.py     the human summary of a job report
"""
