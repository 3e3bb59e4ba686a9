"""``edgespec serve``: an OpenAI-compatible local server over one engine.

FastAPI and uvicorn carry the HTTP; :mod:`edgespec.serve.openai_api` the wire
format. One model runs one generation at a time: requests wait their turn in
a bounded FIFO queue (full: ``503`` with ``Retry-After``). A generation runs
in a thread of its own and hands its chunks to the request's event loop; a
client that goes away sets that generation's own cancel event, which the
engine sees at the next token (or the next prefill chunk). The engine's KV
cache keeps the longest common prefix across requests, so a follow-up turn
of a conversation evaluates only its new tokens.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import queue
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..core.chat_template import template_has_tools
from ..drafters.prediction import PredictedOutput
from ..core.planner import AUTO
from ..drafters.registry import RequestDrafters
from ..core.engine import Engine
from ..errors import EdgespecError
from .metrics import Metrics, log, log_generation
from .native_routes import add_native_routes
from .errors import ApiError
from .guard import Access, protect
from .openai_api import ChatBody, CompletionBody, Request, new_id
from .tool_calls import template_messages
from .page import add_page_routes
from .replies import stream_reply, whole_reply
from .request_fields import CHAT, COMPLETIONS
from ..core.sampling import SamplingParams
from .http import OPEN_PATHS, Whole, api_key, body, events, started

DEFAULT_QUEUE = 8
IDLE_SECONDS = 0.5  # no request for this long: the server is idle (planners are timed then)
_END = object()


@dataclass
class ServerSettings:
    """What the server was started with."""

    model_names: tuple[str, ...]   # the served model's id first, then accepted aliases
    defaults: SamplingParams
    num_draft: int | str           # the default k or "auto"
    api_key: str | None = None
    queue_size: int = DEFAULT_QUEUE
    access: Access = field(default_factory=Access)  # the bound address, hosts and origins let in
    penalties: dict = field(default_factory=dict)  # a request's unset penalties, by field name


class Turns:
    """One generation at a time, the others waiting in FIFO order, at most ``size``."""

    def __init__(self, size: int):
        self.size, self.waiting = size, 0
        self._lock = asyncio.Lock()  # asyncio wakes waiters in the order they came

    async def acquire(self) -> None:
        if self.busy and self.waiting >= self.size:
            raise ApiError(503, f"the server is busy ({self.waiting} requests waiting): retry shortly",
                           type="server_error", code="queue_full", headers={"Retry-After": "1"})
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1

    def release(self) -> None:
        self._lock.release()

    @property
    def busy(self) -> bool:
        """Whether a generation holds the turn."""
        return self._lock.locked()


class Server:
    """The engine, its drafters and the queue in front of them."""

    def __init__(self, engine: Engine, settings: ServerSettings):
        self.engine, self.settings = engine, settings
        engine.planners.defer = True  # nothing is timed inside a request (see work())
        self.idle_seconds = IDLE_SECONDS
        self.timed_while_idle = threading.Event()  # set each time work() has timed planners
        self.drafters = RequestDrafters(engine.drafter)  # a request's by name
        self.prediction = PredictedOutput()  # a request's prediction: one drafter, auto mode kept
        self.turns: Turns | None = None  # made on the server's event loop
        self.jobs: queue.Queue = queue.Queue()  # generations for the thread in work()
        # (finish reason, stats) of the latest generations, cancelled ones too.
        self.finished: collections.deque = collections.deque(maxlen=64)
        self.metrics = Metrics(lambda: (int(bool(self.turns and self.turns.busy)),
                                        self.turns.waiting if self.turns else 0),
                               lambda: engine.prompt_cache)

    # -- one request --------------------------------------------------------------------

    def start(self, request: Request, cancel: threading.Event, progress=None):
        """Make the request's generation, with its drafter and k (checks the prompt);
        the engine's own settings stay as they are. ``progress``: told how far the
        prompt's processing has come."""
        engine = self.engine
        try:
            drafter = self.drafters.get(request.drafter)
        except EdgespecError as exc:
            raise ApiError(400, str(exc), param="speculative.drafter") from None
        speculative = drafter is not None
        num_draft = request.num_draft or self.settings.num_draft
        extras = request.extras
        if extras.prediction is not None:  # drafted from, in auto mode unless a k was asked
            self.prediction.expect(engine.target.tokenize(extras.prediction, add_bos=False, special=False))
            drafter, num_draft, speculative = self.prediction, request.num_draft or AUTO, True
        options = dict(max_tokens=request.max_tokens or engine.n_ctx, stop=request.stop,
                       speculative=speculative, cancel=cancel, shaping=extras.shaping,
                       logprobs=extras.logprobs, drafter=drafter if speculative else None,
                       num_draft=num_draft if speculative else 1, cache_prompt=request.cache_prompt,
                       progress=progress)
        if request.kind == "chat":
            tools = extras.tools if extras.tool_choice != "none" else None
            if tools and not template_has_tools(engine.target.chat_template()):
                raise ApiError(400, f"{self.settings.model_names[0]}'s chat template has no tools "
                                    f"section: this model cannot call tools", param="tools")
            return engine.chat(template_messages(request.prompt), params=request.params, tools=tools,
                               **options)
        return engine.stream(request.prompt, request.params, **options)

    async def run(self, request: Request) -> AsyncIterator:
        """Wait for a turn, then yield the generation's chunks as they come (and, with
        ``return_progress``, :class:`~edgespec.core.generation.PromptProgress` items
        before them).

        Raises :class:`ApiError` before the first chunk (queue full, bad prompt).
        The generation runs as a job of :meth:`work`; the turn passes on only
        when that job has finished.
        """
        waits = self.turns.busy
        try:
            await self.turns.acquire()
        except ApiError:
            self.metrics.count("rejected")
            raise
        if waits:
            self.metrics.count("queued")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def put(item) -> None:
            with contextlib.suppress(RuntimeError):  # (the loop is gone at shutdown)
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def job() -> None:
            try:
                try:
                    chunks = self.start(request, cancel, put if request.return_progress else None)
                except ApiError as exc:
                    put(exc)
                    return
                except (EdgespecError, ValueError) as exc:  # its prompt (too long, say): a 400
                    put(ApiError(400, str(exc), param="messages" if request.kind == "chat" else "prompt"))
                    return
                except Exception as exc:  # noqa: BLE001 - a 500 for the request, not a dead worker
                    put(exc)
                    return
                try:
                    for item in chunks:
                        if item.finish_reason is not None:
                            self.finished.append((item.finish_reason, item.stats))
                            self.metrics.generation(item.stats, item.finish_reason)
                            log_generation(request.kind, item.finish_reason, item.stats)
                        put(item)
                except Exception as exc:  # noqa: BLE001 - handed to the request
                    put(exc)
                finally:
                    chunks.close()
            finally:
                put(_END)
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self.turns.release)

        self.jobs.put(job)
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()  # a client gone (or done): the generation ends at its next token

    def work(self) -> None:
        """Run the generations, one after another, in the calling thread, until
        :meth:`stop_work`. llama.cpp runs measurably faster (~9% on a 2-core CPU)
        in the thread that loaded the models than in another one, so
        ``edgespec serve`` gives this its main thread and HTTP another.

        What a request's auto planner was not timed for (a drafter named for the first
        time: a calibration, long passes) is timed here once no request has come for
        ``idle_seconds``, never inside a request."""
        planners = self.engine.planners
        while True:
            try:
                job = self.jobs.get(timeout=self.idle_seconds if planners.pending else None)
            except queue.Empty:  # idle
                try:
                    planners.time_pending(self.engine.target_cache)
                except Exception as exc:  # noqa: BLE001 - auto mode goes on from what it has
                    log.warning("timing a drafter while idle failed (%s: %s)", type(exc).__name__, exc)
                self.timed_while_idle.set()
                continue
            if job is None:
                return
            job()

    def stop_work(self) -> None:
        """End :meth:`work` once the job in hand (if any) is done."""
        self.jobs.put(None)


def create_app(engine: Engine, settings: ServerSettings, *, worker_thread: bool = True):
    """The FastAPI application serving ``engine``.

    ``worker_thread``: run the generations in a thread of the app's own; False
    when the caller runs ``app.state.server.work()`` itself (in the thread that
    loaded the models, as :func:`serve` does).
    """
    server = Server(engine, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.turns = Turns(settings.queue_size)
        if worker_thread:
            threading.Thread(target=server.work, name="edgespec-generation", daemon=True).start()
        try:
            yield
        finally:
            if worker_thread:
                server.stop_work()

    app = FastAPI(title="edgespec", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server
    protect(app, settings.access, server.metrics.refusal)  # other sites' pages, rebinding, non-JSON

    def error_response(error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(ApiError)
    async def on_api_error(_, error: ApiError):
        return error_response(error)

    @app.exception_handler(HTTPException)
    async def on_http_error(_, error: HTTPException):
        return error_response(ApiError(error.status_code, str(error.detail),
                                       code="not_found" if error.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def on_bug(_, error: Exception):  # a bug of ours: a message, never a traceback
        return error_response(ApiError(500, f"internal error ({type(error).__name__}: {error})",
                                       type="server_error"))

    api = APIRouter(dependencies=[api_key(settings.api_key)])  # all but health and the page
    vocab_size = engine.target.vocab.size

    async def complete(request: Request):
        # Whatever model a request names, the one model serves it (as in llama-server).
        model, id = settings.model_names[0], new_id(request.kind)
        stream = await started(server.run(request))  # waits for a turn; errors become statuses
        if request.stream:
            return events(stream_reply(request, id, model, stream, engine.target.token_bytes))
        return Whole(stream, whole_reply(request, id, model, engine.target.token_bytes))

    @api.post("/v1/chat/completions")
    async def chat_completions(chat: ChatBody = body(ChatBody, CHAT, vocab_size=vocab_size)):
        return await complete(chat.request(settings.defaults, settings.penalties))

    @api.post("/v1/completions")
    async def completions(completion: CompletionBody = body(CompletionBody, COMPLETIONS, vocab_size=vocab_size)):
        return await complete(completion.request(settings.defaults, settings.penalties))

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": settings.model_names[0], "object": "model",
                                            "created": 0, "owned_by": "edgespec",
                                            "meta": {"n_ctx": engine.n_ctx}}]}

    @app.get(OPEN_PATHS[0])
    @app.get(OPEN_PATHS[1])
    async def health():
        turns = server.turns
        return {"status": "ok", "generating": bool(turns and turns.busy),
                "waiting": turns.waiting if turns else 0}

    add_native_routes(api, server)
    app.include_router(api)
    add_page_routes(app)  # the chat page at / and its files under /assets/
    return app


def serve(engine: Engine, settings: ServerSettings, *, host: str, port: int) -> None:
    """Run the server until Ctrl-C; the caller closes the engine afterwards.

    The socket is bound before the "serving on" line is printed, so a client
    (or a test) that reads it can connect at once; ``port=0`` picks a free port.
    """
    import uvicorn
    if not log.handlers:  # a line per request on stderr, as llama-server prints its timings
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("edgespec: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    if host not in ("127.0.0.1", "localhost", "::1") and settings.api_key is None:
        print(f"edgespec: warning: serving on {host} without --api-key: anyone who can reach "
              f"this machine can use the model", file=sys.stderr)
    try:
        sock = bind(host, port)
    except OSError as exc:
        raise EdgespecError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): "
                            f"choose another --port") from None
    bound = sock.getsockname()[1]
    # The Host check answers to the address bound here, whatever the settings said.
    settings = dataclasses.replace(settings, access=dataclasses.replace(settings.access, host=host))
    app = create_app(engine, settings, worker_thread=False)
    # SIGTERM (a service manager, a desktop app ending its child) stops the server as
    # Ctrl-C does, so the models are freed and the socket closed, not just killed.
    in_main = threading.current_thread() is threading.main_thread()  # (signals go there only)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if in_main else None
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    http = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="edgespec-http")
    http.start()
    print(f"edgespec: serving {settings.model_names[0]} on http://{host}:{bound} "
          f"(OpenAI API at /v1, chat page at /); Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        app.state.server.work()  # generations run here, in the thread that loaded the models
    finally:  # Ctrl-C (or an error): stop taking requests, let the HTTP side wind down
        server.should_exit = True
        http.join()
        sock.close()
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host is one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock
