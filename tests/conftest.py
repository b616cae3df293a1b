"""Shared fixtures: tiny random-weight checkpoints (float64) and the bundled SmolLM2 model."""

import os
import shutil
import socket
import threading
import time
import types

import pytest
import torch

# Tiny models run fastest on one thread: a second only adds synchronisation, and on a busy 2-core
# machine its spinning made tests several times slower. (Engines give back whatever they pin.)
torch.set_num_threads(1)



@pytest.fixture(autouse=True)
def eager_by_default(monkeypatch):
    """Compiling a forward pass takes tens of seconds per size: tests run eagerly unless they ask
    for `compile_sizes` themselves (tests/engine/test_compiled_forward.py)."""
    monkeypatch.setattr("minedraft.config.CPU_COMPILE_SIZES", ())


TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=None,
)


def save_tiny_checkpoint(path, arch: str = "llama", seed: int = 0, **overrides):
    """A random-weight Hugging Face checkpoint, float64, weights large enough to be peaked."""
    import transformers

    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[arch]
    config = config_cls(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.25)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory):
    """Another random model with the target's vocabulary: it agrees with it only sometimes."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_draft"), "llama", seed=1, num_hidden_layers=1)


@pytest.fixture(scope="session")
def smollm2_path():
    """The bundled default model as a converted checkpoint folder (converts once per machine)."""
    from minedraft.models.loader import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from minedraft import LLM

    return LLM(str(smollm2_path), max_num_seqs=8, max_model_len=512)


def save_distilled_draft(path, target, init_layers=(1,), keep_every: int = 3):
    """A drafter in the format `minedraft train-draft` exports: some of the target's layers, the
    target's embedding (shared, not stored), a head over part of the vocabulary (float16)."""
    from minedraft.models.loader import read_config
    from minedraft.training.distill import Student

    vocab = read_config(target)["vocab_size"]
    ids = torch.tensor([i for i in range(vocab) if i % keep_every])
    return Student(target, init_layers, ids).export(path, {})


@pytest.fixture(scope="session")
def tiny_distilled(tiny_llama, tmp_path_factory):
    return save_distilled_draft(tmp_path_factory.mktemp("tiny_distilled"), tiny_llama)


def keep_float64(hf_model):
    """transformers computes RMSNorm and RoPE in float32 even in a float64 model; make those two
    float64 so a 1e-9 comparison measures our decoder, not transformers' downcasts."""

    def norm_forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        freqs = position_ids[..., None].double() * self.inv_freq.double()
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    for module in hf_model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            module.forward = types.MethodType(norm_forward, module)
        elif name.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(rope_forward, module)
    return hf_model


KEY = "test-key"


@pytest.fixture(scope="session")
def tiny_chat(tmp_path_factory, smollm2_path):
    """A tiny random model with SmolLM2's tokenizer and chat template: text in, (random) text out."""
    folder = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_chat"), "llama", vocab_size=49152,
                                  max_position_embeddings=512)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2_path / name).is_file():
            shutil.copy(smollm2_path / name, folder / name)
    return folder


class LiveServer:
    """Our server on a free local port, on a thread of this process."""

    def __init__(self, model, max_queue=256, api_key=KEY, **engine_kwargs):
        import openai
        import uvicorn

        from minedraft.config import EngineConfig
        from minedraft.engine.llm_engine import LLMEngine
        from minedraft.server.api import create_app
        from minedraft.server.async_engine import AsyncEngine

        config = EngineConfig(model=str(model), **{"max_model_len": 256, **engine_kwargs})
        self.engine = AsyncEngine(LLMEngine(config), max_queue=max_queue)
        app = create_app(self.engine, "test-model", api_key)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=KEY)

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.shutdown()

    def running(self) -> float:
        import httpx

        text = httpx.get(self.url + "/metrics").text
        return float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("minedraft:num_requests_running ")))


def reference_probabilities(logits: torch.Tensor, params) -> torch.Tensor:
    """A row at `params` (SamplingParams) temperature, top-k and top-p the plain way: sort the whole
    row, cut, renormalise."""
    values, order = (logits / params.temperature).sort(descending=True)
    k = len(values) if params.top_k == -1 else params.top_k
    probs = torch.softmax(values[:k], -1)
    keep = (probs.cumsum(-1) - probs) < params.top_p
    probs = torch.where(keep, probs, 0) / probs[keep].sum()
    return torch.zeros_like(logits).scatter(0, order[:k], probs)


def session_processes(sid: int) -> list[int]:
    """Processes still in session `sid`, zombies included."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # it has just ended
            continue
        if int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


def processes_left(sid: int, timeout_s: float = 5.0) -> list[int]:
    """Processes of session `sid` still there after waiting up to `timeout_s` for them to end."""
    deadline = time.monotonic() + timeout_s
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
