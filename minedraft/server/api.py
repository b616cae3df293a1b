"""OpenAI-compatible HTTP API: completions, chat completions (streaming or not), models, health,
Prometheus metrics. Errors use OpenAI's error JSON; bad input is a 400 naming the field."""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from minedraft.engine.sequence import CompletionOutput, RequestOutput
from minedraft.sampling import MAX_LOGPROBS, SamplingParams
from minedraft.server.async_engine import AsyncEngine, EngineDeadError, QueueFullError
from minedraft.server.metrics import ServerMetrics


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None):
        self.status, self.message, self.type, self.param = status, message, type_, param


def error_response(status: int, message: str, type_: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": None}},
                        status_code=status)


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False
    # vLLM's extension: usage in every chunk, and a chunk for every step that added tokens, even
    # when they do not complete a character yet (a client can then time each token's arrival)
    continuous_usage_stats: bool = False


class SamplingFields(BaseModel):
    # Strict: JSON true is not the integer 1, nor "2" the number 2. Fields we do not know are ignored.
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: int | None = Field(default=None, description="default: 16 for completions, 256 for chat, "
                                                              "at most what the context leaves")
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = Field(default=1, ge=1, le=128)  # bounded: each choice holds a KV slot
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False


class CompletionRequest(SamplingFields):
    prompt: str | list[int] = Field(description="text, or token ids")
    logprobs: int | None = Field(default=None, description=f"0..{MAX_LOGPROBS} most likely tokens per position")


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True)

    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, description=f"0..{MAX_LOGPROBS}; needs logprobs: true")


def requested_max_tokens(req: SamplingFields) -> int | None:
    """The request's own limit (chat: max_completion_tokens before max_tokens), or None."""
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        return req.max_completion_tokens
    return req.max_tokens


def bad_request(e: ValueError, req: SamplingFields) -> APIError:
    """A 400 for a ValueError of SamplingParams or the engine: its message starts with the field's
    name, renamed where the request calls it something else."""
    name = str(e).split(" ", 1)[0]
    if isinstance(req, ChatRequest):
        chat_names = {"prompt": "messages", "logprobs": "top_logprobs",
                      "max_tokens": "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"}
        name = chat_names.get(name, name)
    return APIError(400, str(e), "invalid_request_error", name)


def sampling_params(req: SamplingFields, default_max_tokens: int) -> SamplingParams:
    max_tokens = requested_max_tokens(req)
    if isinstance(req, ChatRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "invalid_request_error", "top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        logprobs = req.logprobs
    try:
        return SamplingParams(n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                              max_tokens=default_max_tokens if max_tokens is None else max_tokens, stop=req.stop,
                              seed=req.seed, ignore_eos=req.ignore_eos, logprobs=logprobs)
    except ValueError as e:
        raise bad_request(e, req) from None


def create_app(server: AsyncEngine, model_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="MineDraft", description="OpenAI-compatible server with batch parallel speculative decoding")
    name_model_in_schema(app, model_name)
    metrics = ServerMetrics(server)
    server.on_finish = metrics.observe
    add_error_handlers(app)
    add_key_check(app, api_key)
    add_operations_routes(app, server, metrics)
    add_openai_routes(app, server, model_name)
    return app


def name_model_in_schema(app: FastAPI, model_name: str) -> None:
    """The documented schema names the one model this server serves."""
    document = app.openapi

    def openapi() -> dict:
        schema = document()
        for name in ("CompletionRequest", "ChatRequest"):
            schema["components"]["schemas"][name]["properties"]["model"]["enum"] = [model_name]
        return schema

    app.openapi = openapi


def add_error_handlers(app: FastAPI) -> None:
    """Our errors and FastAPI's validation errors as OpenAI's error JSON."""

    @app.exception_handler(APIError)
    async def on_api_error(_: Request, e: APIError):
        return error_response(e.status, e.message, e.type, e.param)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, e: RequestValidationError):
        first = e.errors()[0]
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        # The top-level field (a union's member or a list index may follow it); none for bad JSON.
        param = loc[0] if loc and first.get("type") != "json_invalid" else None
        where = ".".join(loc) if param else "body"
        return error_response(400, f"{where}: {first.get('msg', 'invalid')}", "invalid_request_error", param)


def add_key_check(app: FastAPI, api_key: str | None) -> None:
    """With a key, every /v1/ route asks for it; health, metrics and debug stay open."""

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if api_key is not None and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return error_response(401, "invalid API key", "authentication_error")
        return await call_next(request)


def add_operations_routes(app: FastAPI, server: AsyncEngine, metrics: ServerMetrics) -> None:
    """Health, Prometheus metrics and the KV-slot probe."""

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if server.alive else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/kv_slots")
    async def kv_slots() -> dict:
        """Free KV slots in the target and the drafter (null while the drafter is drafting)."""
        try:
            return await server.call(server.engine.free_slots)
        except EngineDeadError as e:
            raise APIError(503, str(e), "server_error") from None


def add_openai_routes(app: FastAPI, server: AsyncEngine, model_name: str) -> None:
    """Models, completions and chat completions."""
    engine = server.engine

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "minedraft"}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_model(req, model_name)
        params = sampling_params(req, 16)
        token_ids = await tokenize(server, req.prompt, req)
        return await respond(server, model_name, request, req, token_ids, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        check_model(req, model_name)
        params = sampling_params(req, 256)
        try:
            prompt = engine.apply_chat_template([m.model_dump() for m in req.messages])
        except (ValueError, TemplateError) as e:
            raise APIError(400, str(e), "invalid_request_error", "messages") from None
        token_ids = await tokenize(server, prompt, req)
        return await respond(server, model_name, request, req, token_ids, params, chat=True)


def check_model(req: SamplingFields, model_name: str) -> None:
    if req.model != model_name:
        raise APIError(404, f"model {req.model!r} does not exist; this server serves {model_name!r}",
                       "invalid_request_error", "model")


async def tokenize(server: AsyncEngine, prompt: str | list[int], req: SamplingFields) -> list[int]:
    try:
        return await run_in_threadpool(server.engine.tokenize_prompt, prompt)
    except ValueError as e:
        raise bad_request(e, req) from None


async def respond(server: AsyncEngine, model_name: str, request: Request, req: SamplingFields,
                  token_ids: list[int], params: SamplingParams, chat: bool):
    """Run the request: a stream of server-sent events, or the whole response when it is done."""
    engine = server.engine
    if requested_max_tokens(req) is None:  # the default never asks for more than the context leaves
        params.max_tokens = min(params.max_tokens, engine.config.max_model_len - len(token_ids))
    outputs = server.generate(token_ids, params)
    try:
        first = await outputs.__anext__()  # errors surface here, before any byte is sent
        meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": model_name}
        decode = token_decoder(engine.tokenizer)
        if req.stream:
            options = req.stream_options or StreamOptions()
            if not (first.finished and failed(first)):
                return StreamingResponse(sse(outputs, first, meta, chat, options, params.logprobs, decode),
                                         media_type="text/event-stream")
            final = first
        else:
            final = await until_done(request, outputs, first)
    except (QueueFullError, EngineDeadError) as e:
        raise APIError(503, str(e), "server_error") from None
    except ValueError as e:
        raise bad_request(e, req) from None
    except RuntimeError as e:  # the engine failed this request (and logged why)
        raise APIError(500, str(e), "server_error") from None
    if failed(final):
        raise APIError(500, ENGINE_FAILED, "server_error")
    return full_response(final, meta, chat, params.logprobs, decode)


ENGINE_FAILED = "the engine failed while generating this request"


def failed(out: RequestOutput) -> bool:
    return any(o.finish_reason == "error" for o in out.outputs)


def token_decoder(tokenizer) -> Callable[[int], str]:
    """The text of one token, as logprobs show it (models without a tokenizer: "token_id:N")."""
    if tokenizer is None:
        return lambda token: f"token_id:{token}"
    return lambda token: tokenizer.decode([token])


async def until_done(request: Request, outputs: AsyncIterator[RequestOutput], first: RequestOutput) -> RequestOutput:
    """The last output; if the client goes away first, stop (which aborts the request)."""
    async def consume():
        last = first
        async for out in outputs:
            last = out
        return last

    if first.finished:
        return first
    task = asyncio.ensure_future(consume())
    while not task.done():
        await asyncio.wait({task}, timeout=0.5)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            await outputs.aclose()
            raise asyncio.CancelledError
    return task.result()


def usage(out: RequestOutput) -> dict:
    completion = sum(len(o.token_ids) for o in out.outputs)
    return {"prompt_tokens": len(out.prompt_token_ids), "completion_tokens": completion,
            "total_tokens": len(out.prompt_token_ids) + completion}


def logprobs_json(o: CompletionOutput, start: int, n: int | None, decode: Callable[[int], str],
                  chat: bool) -> dict | None:
    """OpenAI's logprobs object for the tokens of `o` from `start` on: each chosen token's
    log-probability and the `n` most likely ones."""
    if n is None or o.logprobs is None:
        return None
    chosen = [(decode(t), lp[t]) for t, lp in zip(o.token_ids[start:], o.logprobs[start:])]
    top = [sorted(((decode(t), v) for t, v in lp.items()), key=lambda x: -x[1])[:n] for lp in o.logprobs[start:]]
    if not chat:
        return {"tokens": [t for t, _ in chosen], "token_logprobs": [v for _, v in chosen],
                "top_logprobs": [dict(alternatives) for alternatives in top]}

    def entry(token: str, value: float) -> dict:
        return {"token": token, "logprob": value, "bytes": list(token.encode())}

    return {"content": [{**entry(t, v), "top_logprobs": [entry(*a) for a in alternatives]}
                        for (t, v), alternatives in zip(chosen, top)]}


def full_response(out: RequestOutput, meta: dict, chat: bool, n_logprobs: int | None,
                  decode: Callable[[int], str]) -> dict:
    def logprobs(o: CompletionOutput) -> dict | None:
        return logprobs_json(o, 0, n_logprobs, decode, chat)

    if chat:
        choices = [{"index": o.index, "message": {"role": "assistant", "content": o.text},
                    "logprobs": logprobs(o), "finish_reason": o.finish_reason} for o in out.outputs]
        return {**meta, "object": "chat.completion", "choices": choices, "usage": usage(out)}
    choices = [{"index": o.index, "text": o.text, "logprobs": logprobs(o), "finish_reason": o.finish_reason}
               for o in out.outputs]
    return {**meta, "object": "text_completion", "choices": choices, "usage": usage(out)}


async def sse(outputs: AsyncIterator[RequestOutput], first: RequestOutput, meta: dict, chat: bool,
              options: StreamOptions, n_logprobs: int | None, decode: Callable[[int], str]) -> AsyncIterator[str]:
    """OpenAI's chunk format as server-sent events, ending with `data: [DONE]`; a request the
    engine fails midway ends with an error event instead of its remaining chunks."""
    continuous = options.include_usage and options.continuous_usage_stats
    obj = "chat.completion.chunk" if chat else "text_completion"
    sent: dict[int, int] = {}  # characters sent per choice
    sent_tokens: dict[int, int] = {}  # tokens whose logprobs were sent, per choice
    ended: set[int] = set()  # choices whose finish_reason was sent

    def chunk(choices: list[dict], **extra) -> str:
        return f"data: {json.dumps({**meta, 'object': obj, 'choices': choices, **extra})}\n\n"

    if chat:
        yield chunk([{"index": o.index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                     for o in first.outputs])
    out = first
    try:
        while True:
            if failed(out):
                yield f"data: {json.dumps({'error': {'message': ENGINE_FAILED, 'type': 'server_error'}})}\n\n"
                break
            choices = []
            for o in out.outputs:
                delta = o.text[sent.get(o.index, 0):]
                tokens_unsent = continuous and len(o.token_ids) > sent_tokens.get(o.index, 0)
                if delta or (o.finish_reason and o.index not in ended) or tokens_unsent:
                    sent[o.index] = len(o.text)
                    logprobs = logprobs_json(o, sent_tokens.get(o.index, 0), n_logprobs, decode, chat)
                    sent_tokens[o.index] = len(o.token_ids)
                    if o.finish_reason:
                        ended.add(o.index)
                    body = {"delta": {"content": delta}} if chat else {"text": delta}
                    choices.append({"index": o.index, **body, "logprobs": logprobs, "finish_reason": o.finish_reason})
            if choices:
                yield chunk(choices, **({"usage": usage(out)} if continuous else {}))
            if out.finished:
                if options.include_usage:
                    yield chunk([], usage=usage(out))
                break
            try:
                out = await outputs.__anext__()
            except (EngineDeadError, RuntimeError) as e:  # the engine failed this request, or stopped
                yield f"data: {json.dumps({'error': {'message': str(e), 'type': 'server_error'}})}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:
        await outputs.aclose()  # a client that went away mid-stream aborts its request
