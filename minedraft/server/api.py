"""OpenAI-compatible HTTP API: completions, chat completions (streaming or not), models, health,
Prometheus metrics. Errors use OpenAI's error JSON; bad input is a 400 naming the field."""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from minedraft.engine.sequence import RequestOutput
from minedraft.sampling import SamplingParams
from minedraft.server.async_engine import AsyncEngine, QueueFullError
from minedraft.server.metrics import ServerMetrics


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None):
        self.status, self.message, self.type, self.param = status, message, type_, param


def error_response(status: int, message: str, type_: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": None}},
                        status_code=status)


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, description="default: 16 for completions, 256 for chat")
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
    prompt: str


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


def sampling_params(req: SamplingFields, default_max_tokens: int) -> SamplingParams:
    max_tokens = next((m for m in (getattr(req, "max_completion_tokens", None), req.max_tokens) if m is not None),
                      default_max_tokens)
    try:
        return SamplingParams(n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                              max_tokens=max_tokens, stop=req.stop, seed=req.seed, ignore_eos=req.ignore_eos)
    except ValueError as e:  # the message starts with the field's name
        raise APIError(400, str(e), "invalid_request_error", str(e).split(" ", 1)[0]) from None


def create_app(server: AsyncEngine, model_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="MineDraft", description="OpenAI-compatible server with batch parallel speculative decoding")
    document = app.openapi

    def openapi() -> dict:  # the documented schema names the one model this server serves
        schema = document()
        for name in ("CompletionRequest", "ChatRequest"):
            schema["components"]["schemas"][name]["properties"]["model"]["enum"] = [model_name]
        return schema

    app.openapi = openapi
    metrics = ServerMetrics(server)
    server.on_finish = metrics.observe
    engine = server.engine

    @app.exception_handler(APIError)
    async def on_api_error(_: Request, e: APIError):
        return error_response(e.status, e.message, e.type, e.param)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, e: RequestValidationError):
        first = e.errors()[0]
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        return error_response(400, f"{param or 'body'}: {first.get('msg', 'invalid')}", "invalid_request_error", param)

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if api_key is not None and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return error_response(401, "invalid API key", "authentication_error")
        return await call_next(request)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "minedraft"}]}

    def check_model(req: SamplingFields) -> None:
        if req.model != model_name:
            raise APIError(404, f"model {req.model!r} does not exist; this server serves {model_name!r}",
                           "invalid_request_error", "model")

    async def tokenize(prompt: str) -> list[int]:
        try:
            return await run_in_threadpool(engine.tokenize_prompt, prompt)
        except ValueError as e:
            raise APIError(400, str(e), "invalid_request_error", "prompt") from None

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_model(req)
        params = sampling_params(req, 16)
        token_ids = await tokenize(req.prompt)
        return await respond(request, req, token_ids, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        check_model(req)
        params = sampling_params(req, 256)
        try:
            prompt = engine.apply_chat_template([m.model_dump() for m in req.messages])
        except ValueError as e:
            raise APIError(400, str(e), "invalid_request_error", "messages") from None
        token_ids = await tokenize(prompt)
        return await respond(request, req, token_ids, params, chat=True)

    async def respond(request: Request, req: SamplingFields, token_ids: list[int], params: SamplingParams,
                      chat: bool):
        outputs = server.generate(token_ids, params)
        try:
            first = await outputs.__anext__()  # errors surface here, before any byte is sent
        except QueueFullError as e:
            raise APIError(503, str(e), "server_busy") from None
        except ValueError as e:
            raise APIError(400, str(e), "invalid_request_error", "prompt") from None
        meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": model_name}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(sse(outputs, first, meta, chat, include_usage), media_type="text/event-stream")
        final = await until_done(request, outputs, first)
        return full_response(final, meta, chat)

    return app


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


def full_response(out: RequestOutput, meta: dict, chat: bool) -> dict:
    if chat:
        choices = [{"index": o.index, "message": {"role": "assistant", "content": o.text},
                    "logprobs": None, "finish_reason": o.finish_reason} for o in out.outputs]
        return {**meta, "object": "chat.completion", "choices": choices, "usage": usage(out)}
    choices = [{"index": o.index, "text": o.text, "logprobs": None, "finish_reason": o.finish_reason}
               for o in out.outputs]
    return {**meta, "object": "text_completion", "choices": choices, "usage": usage(out)}


async def sse(outputs: AsyncIterator[RequestOutput], first: RequestOutput, meta: dict, chat: bool,
              include_usage: bool) -> AsyncIterator[str]:
    """OpenAI's chunk format as server-sent events, ending with `data: [DONE]`."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    sent: dict[int, int] = {}  # characters sent per choice
    ended: set[int] = set()  # choices whose finish_reason was sent

    def chunk(choices: list[dict], **extra) -> str:
        return f"data: {json.dumps({**meta, 'object': obj, 'choices': choices, **extra})}\n\n"

    if chat:
        yield chunk([{"index": o.index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                     for o in first.outputs])
    out = first
    try:
        while True:
            choices = []
            for o in out.outputs:
                delta = o.text[sent.get(o.index, 0):]
                if delta or (o.finish_reason and o.index not in ended):
                    sent[o.index] = len(o.text)
                    if o.finish_reason:
                        ended.add(o.index)
                    body = {"delta": {"content": delta}} if chat else {"text": delta, "logprobs": None}
                    choices.append({"index": o.index, **body, "finish_reason": o.finish_reason})
            if choices:
                yield chunk(choices)
            if out.finished:
                break
            out = await outputs.__anext__()
        if include_usage:
            yield chunk([], usage=usage(out))
        yield "data: [DONE]\n\n"
    finally:
        await outputs.aclose()  # a client that went away mid-stream aborts its request
