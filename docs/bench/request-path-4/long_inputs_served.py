"""Issue 57's two long inputs through a running server, read off ``Server-Timing`` (BENCHMARKS.md machine V):
a context that is one 12,000-letter word, and 20,000 characters of short sentences with a 150-word question
(bench.decode_cases' texts), three times each. Start the server first, then from the repository root::

    python -m server --model models/squad2-small-int8 --backend onnx --threads 1 --port 18777 &
    python docs/bench/request-path-4/long_inputs_served.py http://127.0.0.1:18777
"""

import json
import random
import sys
import urllib.request


def texts() -> list[tuple[str, str, str]]:
    rng = random.Random(0)
    word = "".join(rng.choice("abcdefghij") for _ in range(12_000))
    sentences = " ".join(f"Item {i} was made in town {i % 97} by worker {i % 13}." for i in range(420))[
        :20_000
    ]
    question = " ".join(f"word{i} town" for i in range(75))
    return [
        ("12,000-letter word", "What is the word?", word),
        ("20,000 characters, 150-word question", question, sentences),
    ]


def main(url: str) -> None:
    for name, question, context in texts():
        for run in range(3):
            body = json.dumps({"question": question, "context": context}).encode()
            request = urllib.request.Request(
                f"{url}/v1/answer", data=body, headers={"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                timing = response.headers["server-timing"]
                answer = json.load(response)
            stages = dict(part.split(";dur=") for part in timing.split(", "))
            span = answer.get("best_span") or {}
            print(
                f"{name}, run {run}: decode {stages['decode']} ms, engine {stages['engine']} ms, "
                f"best span {len(span.get('text', ''))} characters"
            )


if __name__ == "__main__":
    main(sys.argv[1])
