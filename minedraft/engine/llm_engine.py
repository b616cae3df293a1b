"""The step loop: schedule, run the model, sample, append, stop."""

import itertools
import time

import torch

from minedraft.config import EngineConfig
from minedraft.drafters import DraftModelProposer
from minedraft.engine.detokenizer import Detokenizer
from minedraft.engine.metrics import SpecDecodeMetrics
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.engine.scheduler import Scheduler
from minedraft.engine.sequence import RequestOutput, Sequence, Status
from minedraft.models.loader import eos_token_ids, load_model, load_tokenizer
from minedraft.sampling import SamplingParams, make_generator, probabilities, rejection_sample, sample


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        device, dtype = torch.device(config.device), config.torch_dtype
        model = load_model(config.model_path, dtype, device)
        self.runner = ModelRunner(model, config.num_slots, config.max_model_len, dtype, device)
        self.proposer = None
        self.spec_metrics = SpecDecodeMetrics()
        spec = config.speculative
        if spec is not None:
            draft = model if spec.model == "self" else load_model(spec.model_path, dtype, device)
            self.proposer = DraftModelProposer(draft, config.num_slots, config.max_model_len, dtype, device)
        self.scheduler = Scheduler(self.runner.cache, config.max_num_batched_tokens)
        self.tokenizer = load_tokenizer(config.model_path)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.eos_token_ids = eos_token_ids(config.model_path, self.tokenizer)
        self.generator = make_generator(config.seed)
        self.requests: dict[str, list[Sequence]] = {}
        self._ids = itertools.count()
        self._seq_ids = itertools.count()

    # -- requests ---------------------------------------------------------------------------------

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"model {str(self.config.model_path)!r} has no tokenizer: give prompt token ids")
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> str:
        if self.tokenizer is None or not self.tokenizer.chat_template:
            raise ValueError(f"model {str(self.config.model_path)!r} has no chat template")
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        """Queue a prompt (text or token ids); returns its request id. Bad input raises ValueError."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            text, token_ids = prompt, self.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
        if not token_ids:
            raise ValueError("prompt is empty")
        vocab = self.config.model_args.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        limit = self.config.max_model_len - 1
        if len(token_ids) > limit:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens, more than max_model_len - 1 = {limit}"
            )
        request_id = str(next(self._ids)) if request_id is None else request_id
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        seqs = []
        for i in range(params.n):
            gen = None if params.seed is None else make_generator(params.seed + i)
            seq = Sequence(next(self._seq_ids), request_id, i, text, token_ids, params, gen,
                           self.detokenizer.start(len(token_ids)))
            self.scheduler.add(seq)
            seqs.append(seq)
        self.requests[request_id] = seqs
        return request_id

    def abort(self, request_id: str) -> None:
        for seq in self.requests.pop(request_id, []):
            self._finish(seq, "abort")

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_time = time.perf_counter()
        self.scheduler.finish(seq, reason)
        if self.proposer is not None:
            self.proposer.release(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # -- the step ---------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One prefill, decode or speculative step; returns the state of every request that advanced."""
        seqs, prefill = self.scheduler.schedule()
        if not seqs:
            return []
        if prefill or self.proposer is None:
            self._decode(seqs)
        else:
            self._speculate(seqs)
        return self._outputs(seqs)

    def _sampling_generator(self, seq: Sequence) -> torch.Generator | None:
        """The request's own generator, the engine's for unseeded requests, None for greedy ones."""
        return None if seq.params.greedy else seq.generator or self.generator

    def _decode(self, seqs: list[Sequence]) -> None:
        lengths = self.runner.cache.lengths
        logits = self.runner.forward([Row(s.slot, s.tokens_from(lengths[s.slot])) for s in seqs])
        probs = probabilities(logits, [s.params for s in seqs])
        tokens = sample(probs, [self._sampling_generator(s) for s in seqs])
        for seq, token in zip(seqs, tokens):
            self.append_tokens(seq, [token])

    def _draft_len(self, seq: Sequence) -> int:
        """k, less near the end: a round emits at most k + 1 tokens and must fit in the context."""
        room = min(seq.params.max_tokens - len(seq.output_token_ids), self.config.max_model_len - len(seq))
        return max(0, min(self.config.speculative.num_speculative_tokens, room - 1))

    def _speculate(self, seqs: list[Sequence]) -> None:
        """Draft, verify every row's drafts in one target pass, keep what rejection sampling accepts."""
        gens = [self._sampling_generator(s) for s in seqs]
        drafts, dists = self.proposer.propose(seqs, [self._draft_len(s) for s in seqs], gens)
        cache = self.runner.cache
        rows = [Row(s.slot, s.tokens_from(cache.lengths[s.slot]) + d, len(d) + 1) for s, d in zip(seqs, drafts)]
        logits = self.runner.forward(rows)
        params = [s.params for s, d in zip(seqs, drafts) for _ in range(len(d) + 1)]
        targets = probabilities(logits, params).split([len(d) + 1 for d in drafts])
        for seq, d, q, p, gen in zip(seqs, drafts, dists, targets, gens):
            tokens = rejection_sample(p, q, d, gen)
            self.spec_metrics.observe(len(d), len(tokens) - 1)
            self.append_tokens(seq, tokens)
            if seq.status != Status.FINISHED:  # drop KV entries of rejected drafts, in both models
                cache.truncate(seq.slot, len(seq) - 1)
                self.proposer.rollback(seq)

    def append_tokens(self, seq: Sequence, tokens: list[int]) -> None:
        """Append generated tokens one by one, stopping (and freeing the slot) at the first stop."""
        if seq.first_token_time is None:
            seq.first_token_time = time.perf_counter()
        for token in tokens:
            seq.output_token_ids.append(token)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._finish(seq, reason)
                return

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
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
        if len(seq.output_token_ids) >= params.max_tokens or len(seq) >= self.config.max_model_len:
            return "length"
        return None

    def _outputs(self, seqs: list[Sequence]) -> list[RequestOutput]:
        outputs = []
        for request_id in dict.fromkeys(s.request_id for s in seqs):
            group = self.requests[request_id]
            out = RequestOutput.from_sequences(group)
            if out.finished:
                del self.requests[request_id]
            outputs.append(out)
        return outputs
