"""The proposer vLLM's model worker runs: it drafts nothing. It exists to switch on vLLM's
verification (`speculative_config={"method": "custom_class", ...}`); the drafts that count are the
ones PSDScheduler puts into each request before the step is scheduled."""

from minedraft.vllm import check_version


class NullProposer:
    def __init__(self, vllm_config) -> None:
        check_version()

    def load_model(self, model) -> None:
        """vLLM's CPU runner calls this unconditionally; there is nothing to load."""

    def propose(self, sampled_token_ids: list[list[int]], *args, **kwargs) -> list[list[int]]:
        return [[] for _ in sampled_token_ids]
