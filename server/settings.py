"""Server settings: environment variables (prefix ``XLNETQA_``), overridden by command-line flags.

Every limit that protects the server (input sizes, queue length, timeouts) lives here, so an operator
can tune it without code changes, and tests can start servers with tiny limits.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from qa_core.contract import MAX_N_BEST
from qa_core.runtime.backends import ServerBackend
from qa_core.runtime.cores import default_threads
from qa_core.runtime.providers import TENSORRT, parse_providers

ENV_PREFIX = "XLNETQA_"
ENGINE_ADDRESS_ENV = (
    ENV_PREFIX + "ENGINE_ADDRESS"
)  # set by the supervisor for fronts and the engine (internal)
JSON_BYTES_PER_CHAR = 12  # the most one character can take in a JSON string ("\ud83d\ude00" is one)
LOAD_TIMEOUT_S = 600.0
ENGINE_BUILD_TIMEOUT_S = 3600.0  # xlnet-large engines for several profiles build in tens of minutes
ITEM_OVERHEAD_BYTES = 512  # field names, numbers, whitespace of one request item (generous)


def url_password(url: str) -> str | None:
    """The password of ``scheme://user:password@host...`` (or its ``?password=`` for a unix socket), or None."""
    try:
        parts = urlsplit(url)
        return parts.password or next(iter(parse_qs(parts.query).get("password", [])), None)
    except ValueError:
        return None


MAX_BATCH_SIZE = 256  # windows per backend call; see the max_batch_size field


class ServerSettings(BaseSettings):
    """All knobs of ``python -m server``; each field ``foo`` is also the env var ``XLNETQA_FOO``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", validate_default=True)

    model: Path | None = Field(
        None, description="Export directory (onnx/trt) or checkpoint directory (torch)"
    )
    backend: ServerBackend = "onnx"
    allow_unhashed_model: bool = Field(
        False,
        description="serve an export whose export.json records no file hashes (files_sha256, written by every "
        "exporter of this project): its files are not verified, and one warning says so. A file whose hash "
        "is listed and differs, or a served file missing from the list, is refused all the same",
    )
    model_name: str | None = Field(None, description="Name reported in responses (default: directory name)")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    listen_fd: int | None = Field(
        None,
        ge=0,
        description="Serve this inherited, listening TCP socket instead of binding --host and --port (systemd "
        "socket activation, or a supervisor or test harness that bound it: no moment in which another process "
        "can take the port)",
    )
    workers: int = Field(
        1,
        ge=1,
        description="Front processes (HTTP, the door, tokenizing, decoding) over one engine process that owns "
        "the model and batches for all of them; 1 = one process does both (see --engine-process)",
    )
    engine_process: bool = Field(
        False,
        description="Run the model in an engine process of its own even with one front (implied by --workers "
        "> 1): one GIL never holds both the HTTP work and the engine",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="Intra-op threads of the backend (default: $OMP_NUM_THREADS, else the cores this process "
        "may use, its affinity within its cgroup's CPU quota, at most 8)",
    )
    inter_op_threads: int = Field(1, ge=1)
    providers: str = Field(
        "auto",
        description="onnxruntime providers, comma-separated, full or short names (cpu, cuda, tensorrt/trt; "
        "e.g. 'tensorrt' or 'CUDAExecutionProvider,CPUExecutionProvider'); 'auto' = CUDA when its libraries "
        "load and a GPU is there, else CPU (TensorRT only when named). A named first provider that onnxruntime "
        "cannot activate stops the start (see --allow-cpu-fallback)",
    )
    allow_cpu_fallback: bool = Field(
        False,
        description="serve even when onnxruntime falls back from the first --providers entry to another "
        "(e.g. CUDA libraries missing: 20-100x slower); the providers really used are logged and reported",
    )
    device_id: int = Field(
        0, ge=0, description="CUDA device of the onnxruntime GPU providers and of the TensorRT backend (trt)"
    )
    torch_device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:[0-9]+)?)$",
        description="--backend torch: where the model runs, cpu or cuda[:N] (a torch that cannot is a refusal)",
    )
    torch_dtype: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="--backend torch: the weights' and activations' precision (fp16/bf16: a GPU's)"
    )
    torch_cuda_graphs: bool = Field(
        False,
        description="--backend torch on CUDA: record one CUDA graph per (batch, length) bucket of the batches "
        "the server forms (batch sizes: powers of two up to --max-batch-size; lengths: multiples of "
        "--pad-multiple-of, else 64, up to max_seq_len) at warm-up, and replay it instead of launching "
        "kernels one by one (GPU memory: one pool for all buckets)",
    )
    torch_compile: bool = Field(
        False,
        description="--backend torch on CUDA: like --torch-cuda-graphs, over torch.compile's kernels (Inductor fuses "
        "the bias, GELU, residual and LayerNorm work around the matrix products; compiles every bucket at "
        "warm-up: minutes)",
    )
    trt_cache_dir: Path | None = Field(
        None,
        description="onnxruntime TensorRT provider: directory for its engine and timing caches (without it, "
        "every start builds the engine again)",
    )
    trt_fp16: bool = Field(False, description="onnxruntime TensorRT provider: allow fp16 kernels")
    max_batch_size: int = Field(
        8,
        ge=1,
        le=MAX_BATCH_SIZE,
        description=f"Most windows (features) in one backend call (at most {MAX_BATCH_SIZE}: past 16 windows "
        "an H200's cost per window stops falling, and every request in a batch waits for the whole call; "
        "a CUDA-graph backend holds one graph per batch size up to it)",
    )
    batching: Literal["measured", "always"] = Field(
        "measured",
        description="measured: at load, time one window and a batch of the longest length, and group only windows "
        "short enough for a batch to save 20% of their cost (on a CPU running one thread, long windows run one per "
        "call, so a request never waits for another's whole batch); always: group up to --max-batch-size",
    )
    max_batch_delay_ms: float = Field(
        2.0,
        ge=0.0,
        description="Longest a window waits for others while another backend call is in flight (more than "
        "one --inference-workers); an idle engine runs what is queued at once: an upper bound, never a floor",
    )
    max_batch_padding: float = Field(
        0.25, ge=0.0, description="Most padding a batch may carry, as a fraction of its real tokens"
    )
    pad_multiple_of: int | None = Field(
        None, ge=1, description="Round padded lengths up (limits engine shapes)"
    )
    queue_aging_s: float = Field(
        1.0, ge=0.0, description="Fair queueing: a request waiting k times this long gives k+1 windows per "
        "round, so large requests finish within their deadline (0 = strict round-robin)",
    )  # fmt: skip
    inference_workers: int = Field(1, ge=1, description="Backend calls in flight at once")
    max_context_chars: int = Field(20000, ge=1, description="Characters of one context as sent")
    max_question_chars: int = Field(1000, ge=1, description="Characters of one question as sent")
    max_batch_items: int = Field(32, ge=1, description="Questions in one /answer/batch request")
    max_normalized_chars: int = Field(
        65536, ge=1, description="Characters of a request after NFKD normalisation (what the tokenizer reads), "
        "summed over its questions and contexts; checked before tokenizing",
    )  # fmt: skip
    max_request_tokens: int = Field(
        16384, ge=1, description="Tokens of a request (questions + contexts, summed over batch items)"
    )
    max_request_windows: int = Field(
        128, ge=1, description="Windows (model inputs of max_seq_len) of a request, summed over batch items"
    )
    context_cache_mb: float = Field(
        32.0,
        ge=0.0,
        description="Memory for recently sent contexts kept tokenized (with their sentence index), keyed by API "
        "key: a context asked about again skips tokenizing; least recently used first out, one key at most a "
        "quarter of it; 0 = off",
    )
    max_queue: int = Field(
        1024, ge=1, description="Windows waiting for inference; beyond it 503 + Retry-After"
    )
    max_body_bytes: int | None = Field(
        None,
        ge=1024,
        description="Largest request body (default: the largest body the character limits admit, JSON "
        "escapes included)",
    )
    request_timeout_s: float = Field(
        30.0, gt=0.0, description="Featurizing + queue + inference time before a 504"
    )
    watchdog_factor: float = Field(
        20.0, gt=1.0, description="A backend call slower than this multiple of its expected time is a hang"
    )
    watchdog_min_s: float = Field(5.0, gt=0.0, description="The watchdog never calls a call hung sooner")
    retry_after_s: int = Field(1, ge=1, description="Retry-After header value on 503")
    no_answer_threshold: float | None = Field(
        None, ge=0.0, le=1.0, description="Default: the model's sidecar"
    )
    n_best_pool: int | None = Field(
        None,
        ge=1,
        le=MAX_N_BEST,
        description="Spans kept per question when decoding (the n-best list a request's top_k reads); the "
        "answer and the decision read only the best 10, found exactly, so any pool of 10 or more answers "
        "alike; default: the model's n_best (its sidecar or checkpoint metadata), at most the 10 the decision reads",
    )
    load_timeout_s: float | None = Field(
        None,
        gt=0.0,
        description=f"Loading + warm-up longer than this is a failed load (exit 1); default {LOAD_TIMEOUT_S:g} s, "
        f"{ENGINE_BUILD_TIMEOUT_S:g} s with the TensorRT provider (a first start builds its engines)",
    )
    warmup_delay_s: float = Field(0.0, ge=0.0, description="Extra sleep before warm-up (tests of /readyz)")
    graceful_timeout_s: float = Field(
        30.0, gt=0.0, description="How long SIGTERM waits for in-flight requests"
    )
    playground: bool = Field(True, description="Serve the browser playground at GET / (false: 404)")
    # ---- who may ask (server.door.auth, server.door.key_check, server.limits.quotas) ----
    api_keys_file: Path | None = Field(
        None,
        description="File of API keys, one 'name: key' (or bare key) per line; reloaded on change and on SIGHUP. "
        "Keys may also come from the XLNETQA_API_KEYS variable (never from a flag, which ps would show). "
        "Without either, anyone who reaches the port may ask",
    )
    allow_shared_keys_file: bool = Field(
        False,
        description="serve with a keys file other local users can read or write (mode beyond 0600): refused "
        "without this flag, since it hands them every key, or the power to add their own",
    )
    auth_metrics: bool = Field(
        True, description="With keys: /metrics needs one too (false: open to scrapers)"
    )
    limits_redis: str | None = Field(
        None,
        pattern=r"^(rediss?|unix)://",
        description="Keep the per-key rates and daily quotas in this Redis (redis://host:port/db, rediss:// with "
        "TLS, or unix:///path/redis.sock), one set for every replica and process; without it each host keeps "
        "its own, so N replicas mean N times the limits. While it fails, each replica enforces the limits on "
        "its own",
    )
    limits_redis_password_file: Path | None = Field(
        None,
        description="File holding the password of --limits-redis (its first line; private, as the keys file): "
        "a password in the flag itself is refused, since ps shows flags to every local user "
        "(XLNETQA_LIMITS_REDIS may carry the whole URL instead)",
    )
    limits_redis_timeout_ms: float = Field(
        100.0,
        gt=0.0,
        le=10000.0,
        description="Longest wait for the limits store; a call slower than this, or failing, is decided by this "
        "replica's own limits, and 3 in a row stop asking the store for 2 s",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Also serve the metrics, with no key, on this port of --host (for a scraper that cannot "
        "send a key; keep it off the Internet: the API's port keeps /metrics behind a key); 0: any free port, "
        "logged",
    )
    docs: bool = Field(
        True, description="Serve /docs (the API reference, self-contained) and /openapi.json (false: 404)"
    )
    auth_docs: bool = Field(True, description="With keys: the docs and the OpenAPI schema need one too")
    auth_failures_per_minute: float = Field(
        30.0, gt=0.0, description="Failed authentications one client address may make per minute; beyond: 429"
    )
    key_requests_per_s: float | None = Field(None, gt=0.0, description="Per key (or caller): request rate")
    key_request_burst: float | None = Field(None, ge=1.0, description="Per key: requests allowed at once")
    key_windows_per_s: float | None = Field(
        None, gt=0.0, description="Per key: windows (model inputs, the real cost) per second"
    )
    key_window_burst: float | None = Field(
        None,
        ge=1.0,
        description="Per key: windows allowed at once (default: 2 s worth, at least one request's)",
    )
    key_max_inflight_windows: int | None = Field(
        None,
        ge=1,
        description="Per key: windows queued or running at once (default with API keys: a quarter of "
        "--max-queue, at least one maximal request, so one key cannot fill the queue; without keys: none)",
    )
    key_daily_requests: int | None = Field(None, ge=1, description="Per key: requests per UTC day")
    access_log: bool = Field(
        True, description="One JSON line per request (id, key name, status, windows, latency; never text)"
    )
    ssl_certfile: Path | None = Field(None, description="TLS certificate chain (PEM): serve HTTPS")
    ssl_keyfile: Path | None = Field(None, description="TLS private key (PEM) of ssl_certfile")
    trusted_hosts: str | None = Field(
        None,
        description="Host headers answered, comma-separated ('*': any). Default: loopback names when bound "
        "to loopback (against DNS rebinding), else any",
    )
    forwarded_allow_ips: str | None = Field(
        None,
        description="Proxies whose X-Forwarded-For / X-Forwarded-Proto are believed, comma-separated addresses "
        "or networks (e.g. the ingress's pod network 10.0.0.0/8); the failure budget and the access log then "
        "see the real client. Default: none, so a client cannot pick the address it is counted under",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="A request's headers (and a TLS handshake before them) must arrive within this of the "
        "connection's start (slow clients are closed)",
    )
    max_headers: int = Field(
        100, ge=1, description="Header lines of one request; more gets 431 and the connection closed"
    )
    max_header_bytes: int = Field(
        16384,
        ge=256,
        description="Bytes of one request's request line and headers, however they arrive; more gets 431 "
        "and the connection closed (counted while parsing, before the door)",
    )
    body_timeout_s: float = Field(
        30.0, gt=0.0, description="A request's body must arrive within this after its headers (else 408)"
    )
    timeout_keep_alive_s: float = Field(
        5.0, gt=0.0, description="An idle keep-alive connection is closed after this long"
    )
    max_unauthenticated_per_address: int | None = Field(
        None,
        ge=1,
        description="Connections one client address may hold before a request on them has passed the door (a "
        "valid key; any request without keys); more are closed at accept (default: a quarter of "
        "--max-connections, room for a proxy's many clients). The oldest idle such connection is also closed "
        "when a new one would fill --max-connections",
    )
    max_connections_per_key: int | None = Field(
        None,
        ge=1,
        description="Connections one API key's requests may hold (probes and refused requests do not count "
        "them); beyond it the key's oldest idle one is closed (default: a quarter of --max-connections). When "
        "a new connection would fill --max-connections, the idle ones of the key holding the most go first "
        "after those no key has used",
    )
    max_connections: int | None = Field(
        None, ge=1, description="Connections and requests at once before 503 (default: 2 x max_queue + 64)"
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text: time, level, logger, request id and message (the access log's fields as key=value); "
        "json: every line one JSON object (for a log pipeline)",
    )

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        """A request larger than the queue could never be admitted: refuse that configuration."""
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together: give both or neither")
        if self.torch_cuda_graphs and self.torch_compile:
            raise ValueError("torch_cuda_graphs and torch_compile both record graphs: choose one")
        if self.torch_graphs != "off" and not self.torch_device.startswith("cuda"):
            raise ValueError(
                f"torch_{self.torch_graphs.replace('-', '_')} records CUDA graphs: it needs torch_device "
                f"cuda[:N], not {self.torch_device!r}"
            )
        if self.max_request_windows > self.max_queue:
            raise ValueError(
                f"max_request_windows ({self.max_request_windows}) must be <= max_queue ({self.max_queue}), "
                "or a request within the limits could never be queued"
            )
        return self

    @property
    def body_limit(self) -> int:
        """max_body_bytes, or derived from the limits: a request may hold at most max_normalized_chars
        characters (NFKD never shortens a text), each at most 12 bytes as JSON (a surrogate pair of
        \\uXXXX escapes), plus each item's field names and numbers. Defaults: ~0.8 MB, not 8 MiB."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        chars = min(
            self.max_normalized_chars,
            self.max_batch_items * (self.max_context_chars + self.max_question_chars),
        )
        return chars * JSON_BYTES_PER_CHAR + self.max_batch_items * ITEM_OVERHEAD_BYTES + 1024

    @property
    def torch_graphs(self) -> str:
        """How the torch backend records graphs: "off", "cuda-graphs" or "compile"."""
        return "cuda-graphs" if self.torch_cuda_graphs else "compile" if self.torch_compile else "off"

    @property
    def unauthenticated_per_address(self) -> int:
        """The cap on one address's connections no request has passed the door on yet."""
        return self.max_unauthenticated_per_address or max(1, self.connection_limit // 4)

    def inflight_windows_per_key(self, keyed: bool) -> int | None:
        """``key_max_inflight_windows``, or with API keys (``keyed``) its default: a quarter of the queue,
        at least one maximal request; without keys every request is the one caller ``anonymous``, whom
        the queue's own bound limits."""
        if self.key_max_inflight_windows is not None or not keyed:
            return self.key_max_inflight_windows
        return max(self.max_request_windows, self.max_queue // 4)

    @property
    def connections_per_key(self) -> int:
        """The cap on the connections one key's requests hold."""
        return self.max_connections_per_key or max(1, self.connection_limit // 4)

    @property
    def connection_limit(self) -> int:
        """uvicorn's limit_concurrency: beyond it new connections get 503 before any work."""
        return self.max_connections or 2 * self.max_queue + 64

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxy_addresses(cls, value: str | None) -> str | None:
        """Addresses or networks only (``*`` would believe anyone, which is what the default prevents)."""
        if value is None or not value.strip():
            return None
        items = [item.strip() for item in value.split(",") if item.strip()]
        for item in items:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"not an IP address or network: {item[:64]!r}") from None
        return ",".join(items)

    @field_validator("providers")
    @classmethod
    def _known_providers(cls, value: str) -> str:
        """Short names become full ones here, so every later reader sees onnxruntime's spelling."""
        names = parse_providers(value)
        return "auto" if names is None else ",".join(names)

    @property
    def backend_threads(self) -> int:
        """The backend's intra-op threads: the setting, else the default for this process's cores."""
        return self.threads or default_threads()

    @property
    def builds_engines(self) -> bool:
        """Whether loading may build TensorRT engines (the onnxruntime TensorRT provider does, at start)."""
        return self.backend == "onnx" and TENSORRT in (self.provider_list() or [])

    @property
    def load_deadline_s(self) -> float:
        """``load_timeout_s``, or its default for this configuration."""
        if self.load_timeout_s is not None:
            return self.load_timeout_s
        return ENGINE_BUILD_TIMEOUT_S if self.builds_engines else LOAD_TIMEOUT_S

    @property
    def engine_build_note(self) -> str:
        """What the load progress lines add when engines may be building."""
        if not self.builds_engines:
            return ""
        cache = self.trt_cache_dir
        reuse = (
            f"the next start reuses {cache}" if cache else "without --trt-cache-dir every start builds them"
        )
        return f": the TensorRT provider builds its engines at a first start ({reuse})"

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context of ssl_certfile + ssl_keyfile, or None for plain HTTP (TlsSetupError when
        they cannot be used: one line, checked before anything listens)."""
        if self.ssl_certfile is None or self.ssl_keyfile is None:
            return None
        from server.door.tls import server_context

        return server_context(self.ssl_certfile, self.ssl_keyfile)

    def provider_list(self) -> list[str] | None:
        """Explicit onnxruntime providers (full names), or None for automatic selection."""
        return parse_providers(self.providers)

    @property
    def fronts_over_engine(self) -> bool:
        """Front processes over an engine process (``--workers > 1`` or ``--engine-process``)."""
        return self.workers > 1 or self.engine_process

    def to_env(self) -> dict[str, str]:
        """These settings as ``XLNETQA_*`` variables (how the supervisor hands them to the engine and fronts)."""
        out: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is not None:
                out[ENV_PREFIX + name.upper()] = str(value)
        return out
