"""Incremental detokenization: turn each step's new tokens into new text, without re-decoding
the whole output and without emitting half of a multi-byte character."""

from dataclasses import dataclass


@dataclass
class DecodeState:
    prefix_offset: int  # tokens before this one only give context
    read_offset: int  # text of tokens before this one has been emitted


class Detokenizer:
    CONTEXT = 5  # prompt tokens decoded with the first output token, so leading spaces come out right

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def start(self, prompt_len: int) -> DecodeState:
        return DecodeState(max(prompt_len - self.CONTEXT, 0), prompt_len)

    def step(self, state: DecodeState, tail: list[int]) -> str:
        """The text added by the tokens after `state.read_offset`; `tail` holds the sequence's tokens
        from `state.prefix_offset` on. Advances `state`."""
        if self.tokenizer is None:
            return ""
        decode = self.tokenizer.decode
        before = decode(tail[: state.read_offset - state.prefix_offset], skip_special_tokens=True)
        after = decode(tail, skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        state.prefix_offset, state.read_offset = state.read_offset, state.prefix_offset + len(tail)
        return after[len(before) :]
