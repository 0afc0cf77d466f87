"""The floor a Python HTTP server cannot go below: FastAPI on uvicorn answering ``POST /v1/answer`` with
the JSON body it was sent, nothing else (no middleware, no model, no validation beyond JSON).

    python -m bench.echo_app --port 8001 [--http h11|httptools] [--loop asyncio|uvloop]

``bench.serve`` starts it beside the server it measures and loads both with the same client, so
"what the server adds" is read against what FastAPI and uvicorn cost by themselves on this machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI

app = FastAPI()


@app.post("/v1/answer")
async def echo(body: dict[str, Any]) -> dict[str, Any]:
    return body


@app.get("/readyz")
async def ready() -> dict[str, str]:
    return {"status": "ready"}


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m bench.echo_app", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--http", default="auto", choices=("auto", "h11", "httptools"))
    p.add_argument("--loop", default="auto", choices=("auto", "asyncio", "uvloop"))
    args = p.parse_args(argv)
    uvicorn.run(app, host=args.host, port=args.port, http=args.http, loop=args.loop, log_level="warning")


if __name__ == "__main__":
    main()
