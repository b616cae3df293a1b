"""Output processing: append generated tokens, detokenize incrementally, check stops, and
assemble each request's output."""

import time

import torch

from minedraft.engine.detokenizer import Detokenizer
from minedraft.engine.sequence import RequestOutput, Sequence
from minedraft.sampling import top_logprobs


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_ids: set[int], max_model_len: int):
        self.detokenizer = Detokenizer(tokenizer)
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    @staticmethod
    def logprobs(seq: Sequence, logits: torch.Tensor, tokens: list[int]) -> list[dict[int, float]] | None:
        """Log-probabilities for the tokens a sequence is about to append, if it asked for them."""
        n = seq.params.logprobs
        return None if n is None else top_logprobs(logits, tokens, n)

    def append(self, seq: Sequence, tokens: list[int], logprobs: list[dict[int, float]] | None = None) -> str | None:
        """Append generated tokens one by one up to the first stop; returns its finish reason."""
        if seq.first_token_time is None:
            seq.first_token_time = time.perf_counter()
        for i, token in enumerate(tokens):
            seq.output_token_ids.append(token)
            if logprobs is not None:
                seq.logprobs.append(logprobs[i])
            reason = self.stop_reason(seq, token)
            if reason is not None:
                return reason
        return None

    def stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        delta = self.detokenizer.step(seq.decode_state, seq.tokens_from(seq.decode_state.prefix_offset))
        if delta:
            seq.text += delta
            if params.stop_strings:
                window = len(delta) + max(len(s) for s in params.stop_strings)
                tail_start = max(len(seq.text) - window, 0)
                hits = [i for s in params.stop_strings if (i := seq.text.find(s, tail_start)) != -1]
                if hits:
                    seq.text = seq.text[: min(hits)]
                    return "stop"
        if len(seq.output_token_ids) >= params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    @staticmethod
    def request_outputs(requests: dict[str, list[Sequence]], seqs: list[Sequence]) -> list[RequestOutput]:
        """The state of every request with a sequence in `seqs`; finished requests leave `requests`."""
        outputs = []
        for request_id in dict.fromkeys(s.request_id for s in seqs):
            out = RequestOutput.from_sequences(requests[request_id])
            if out.finished:
                del requests[request_id]
            outputs.append(out)
        return outputs
