"""Input processing: prompts to token ids (text, chat messages or ids), and the checks a request
passes before it is admitted."""

from minedraft.config import EngineConfig
from minedraft.models.loader import load_tokenizer
from minedraft.sampling import SamplingParams


class InputProcessor:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.tokenizer = load_tokenizer(config.model_path)

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"prompt must be token ids: model {str(self.config.model_path)!r} has no tokenizer")
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> str:
        if self.tokenizer is None or not self.tokenizer.chat_template:
            raise ValueError(f"model {str(self.config.model_path)!r} has no chat template")
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a prompt (text or ids), checked against the vocabulary and max_model_len."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            try:
                prompt.encode()
            except UnicodeEncodeError:  # the tokenizer would raise a TypeError
                raise ValueError("prompt is not valid Unicode: it holds a lone surrogate") from None
            token_ids = self.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            token_ids = list(prompt)
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not token_ids:
            raise ValueError("prompt is empty")
        vocab = self.config.model_args.vocab_size
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        limit = self.config.max_model_len - 1
        if len(token_ids) > limit:
            raise ValueError(f"prompt has {len(token_ids)} tokens, more than max_model_len - 1 = {limit}")
        return token_ids

    def process(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """A request's prompt token ids, once prompt and parameters passed every check (ValueError
        naming the field otherwise)."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        params.validate()  # again: fields may have been changed since construction
        token_ids = self.tokenize_prompt(prompt)
        room = self.config.max_model_len - len(token_ids)
        if params.max_tokens > room:
            raise ValueError(f"max_tokens {params.max_tokens} is more than the context leaves: max_model_len "
                             f"{self.config.max_model_len} - {len(token_ids)} prompt tokens = {room}")
        return token_ids
