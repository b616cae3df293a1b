"""Proposers of draft tokens for speculative decoding."""

from minedraft.drafters.draft_model import DraftModelProposer

__all__ = ["DraftModelProposer"]
