"""Proposers of draft tokens for speculative decoding."""

from minedraft.drafters.draft_model import DraftModelProposer
from minedraft.drafters.ngram import NgramProposer

__all__ = ["DraftModelProposer", "NgramProposer"]
