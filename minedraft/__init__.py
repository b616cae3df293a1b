"""MineDraft: an inference engine for batch parallel speculative decoding."""

from minedraft.engine.sequence import CompletionOutput, RequestOutput
from minedraft.llm import LLM
from minedraft.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
