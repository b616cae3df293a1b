"""The offline API in vLLM's shape: `LLM(...).generate(prompts, SamplingParams(...))`."""

from tqdm import tqdm

from minedraft.config import EngineConfig
from minedraft.engine.llm_engine import LLMEngine
from minedraft.engine.sequence import RequestOutput
from minedraft.sampling import SamplingParams

Prompt = str | dict  # text, or {"prompt_token_ids": [...]}
Conversation = list[dict]


class LLM:
    """A model ready to generate. Keyword arguments are `EngineConfig` fields."""

    def __init__(self, model: str | None = None, **kwargs):
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def close(self) -> None:
        """Stop the drafter process, if any. Also done at the end of a `with LLM(...)` block, when the
        LLM is garbage-collected and when the program ends, however it ends."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.close()

    def get_metrics(self) -> dict:
        """Speculative-decoding counters (vLLM definitions); all zero without speculation. With
        num_speculative_tokens "auto", `draft_length` holds the controller's k and its inputs, and
        what the proposer chose for itself (whether a model behind a prompt lookup drafts)."""
        engine = self.engine
        metrics = engine.spec_metrics.as_dict()
        if engine.draft_length is not None:
            choices = {} if engine.proposer is None else engine.proposer.choices()
            metrics["draft_length"] = {**engine.draft_length.as_dict(), **choices}
        return metrics

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the prompts' order."""
        prompts = [prompts] if isinstance(prompts, (str, dict)) else prompts
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a prompt or a list of them, got {type(prompts).__name__}")
        params = SamplingParams() if sampling_params is None else sampling_params
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        engine = self.engine
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                if isinstance(prompt, dict):
                    if "prompt_token_ids" not in prompt:
                        raise ValueError("prompt dict needs the key 'prompt_token_ids'")
                    prompt = prompt["prompt_token_ids"]
                    if isinstance(prompt, str):  # text belongs in a plain string prompt
                        raise ValueError("prompt_token_ids must be a list of token ids")
                elif not isinstance(prompt, str):
                    raise ValueError(f"prompt must be a string or {{'prompt_token_ids': [...]}}, "
                                     f"got {type(prompt).__name__}")
                ids.append(engine.add_request(prompt, p))
        except Exception:
            for request_id in ids:  # leave nothing half-queued behind a bad prompt
                engine.abort(request_id)
            raise
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generating", unit="req", disable=not use_tqdm) as bar:
            while len(done) < len(ids):
                for out in engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update()
        return [done[i] for i in ids]

    def chat(
        self,
        messages: Conversation | list[Conversation],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, with the model's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.engine.apply_chat_template(c) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)
