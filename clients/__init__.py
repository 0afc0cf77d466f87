"""Python client for the XLNet QA server (depends on httpx and pydantic only).

Start a server (``python -m server --model runs/demo/onnx --port 8000``), then:

```python
from clients import AsyncXLNetQAClient, XLNetQAClient, XLNetQAError

context = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy."

with XLNetQAClient("http://127.0.0.1:8000", timeout=10.0, retries=3) as qa:
    assert qa.health() and qa.ready()
    print(qa.model_info().head)
    a = qa.answer("Who gave their name to Normandy?", context, top_k=3)
    print(a.answer, a.start, a.end, a.answerable_prob, a.is_impossible, a.best_span)
    assert context[a.start : a.end] == a.answer or a.is_impossible
    for cand in a.n_best:  # top_k > 1: the best spans, best first
        print(f"{cand.probability:.2f} {cand.text!r}")
    results = qa.answer_batch([("When?", context), {"question": "Where?", "context": context}])
    try:
        qa.answer("   ", context)  # a blank question: refused by the SDK before sending (no status)
    except XLNetQAError as err:
        print(err.status_code, err.message)
    try:
        qa.answer("\u200b", context)  # no tokens after normalisation: the server's 422 (never retried)
    except XLNetQAError as err:
        print(err.status_code, err.error, err.message)


async def main() -> None:
    async with AsyncXLNetQAClient("http://127.0.0.1:8000") as aqa:
        print((await aqa.answer("Who gave their name to Normandy?", context)).answer)


import asyncio

asyncio.run(main())
```

Unanswerable questions come back with ``answer == ""`` and ``start == end == -1``. Connection errors
and 503 (not ready / overloaded) are retried with jittered exponential backoff, honouring
``Retry-After`` up to ``max_backoff``, within ``deadline`` seconds per call (60 unless set; None for
none); every failure is an ``XLNetQAError``.

A server with API keys: ``XLNetQAClient(url, api_key=...)`` or the ``XLNETQA_API_KEY`` variable (sent
as ``Authorization: Bearer``; surrounding whitespace stripped, anything but printable ASCII a
``ValueError`` at construction; never in ``repr``, ``vars()`` or error text). 401 is
``XLNetQAAuthenticationError``; 429 is ``XLNetQARateLimitError``, retried after the server's
``Retry-After`` only while that is within ``max_backoff`` and the deadline (a daily quota used up is
raised at once). A key is never sent in clear text beyond this machine: an ``http://`` URL to another
host with a key is a ``ValueError`` unless ``allow_insecure_http=True``. HTTPS: ``verify=`` a CA
bundle's path (or an ``ssl.SSLContext``; ``False`` only on purpose).
"""

from clients.client import AsyncXLNetQAClient, XLNetQAClient
from clients.errors import (
    XLNetQAAuthenticationError,
    XLNetQAClientError,
    XLNetQAConnectionError,
    XLNetQAError,
    XLNetQARateLimitError,
    XLNetQAResponseError,
    XLNetQAServerError,
    XLNetQATimeoutError,
)
from clients.models import Answer, ModelInfo, NBestEntry, QARequest, Timing

__all__ = [
    "Answer",
    "AsyncXLNetQAClient",
    "ModelInfo",
    "NBestEntry",
    "QARequest",
    "Timing",
    "XLNetQAClient",
    "XLNetQAAuthenticationError",
    "XLNetQAClientError",
    "XLNetQAConnectionError",
    "XLNetQAError",
    "XLNetQARateLimitError",
    "XLNetQAResponseError",
    "XLNetQAServerError",
    "XLNetQATimeoutError",
]
