"""The step loop: schedule, run the model, sample, append, stop."""

import itertools
import logging
import time
from contextlib import contextmanager

import torch

from minedraft.config import EngineConfig, check_num_speculative_tokens
from minedraft.engine.batch_manager import BatchManager
from minedraft.engine.input_processor import InputProcessor
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.engine.output_processor import OutputProcessor
from minedraft.engine.overlap import OverlapPolicy
from minedraft.engine.scheduler import Scheduler
from minedraft.engine.sequence import RequestOutput, Sequence, Status
from minedraft.models.loader import eos_token_ids, load_model
from minedraft.sampling import Dist, SamplingParams, make_generator, probabilities, sample
from minedraft.spec_decode import make_proposer
from minedraft.spec_decode.draft_length import DraftLengthController
from minedraft.spec_decode.metrics import SpecDecodeMetrics
from minedraft.spec_decode.rejection import greedy_verify, rejection_sample
from minedraft.spec_decode.remote import cpu_settings, restore_cpu_settings
from minedraft.spec_decode.transport import DrafterError

log = logging.getLogger("minedraft")

# "prefill_on_drafter": prompts the drafter's target copy holds at a time, one it works on and one
# queued behind it, so that it never waits a step for the next; the target prefills the others.
PROMPTS_ON_DRAFTER = 2


class LLMEngine:
    """Modes: `ar` (no speculative_config), `sd` (drafter in this process, or in its own process
    strictly draft-then-verify), `psd` (drafter in its own process, two sub-batches overlapped)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        config.resolve_checkpoints()
        self.cpu_settings = cpu_settings()  # restored by close(): pinning below changes them
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        device = torch.device(config.device)
        model = load_model(config.model_path, config.torch_dtype, device, compiled=bool(config.compile_sizes))
        self.runner = ModelRunner(model, config.num_slots, config.max_model_len, config.torch_dtype, device,
                                  config.compile_sizes, cuda_graphs=not config.enforce_eager)
        self.scheduler = Scheduler(self.runner.cache, config.max_num_batched_tokens, config.enable_chunked_prefill,
                                   config.prefill_stall_ratio, config.max_prompt_tokens_beside_streams,
                                   config.scheduling_policy)
        spec = config.speculative
        self.spec_metrics = SpecDecodeMetrics()
        self.proposer = None
        if spec is not None:
            try:
                self.proposer = make_proposer(config, model)
            except DrafterError as e:  # a drafter that fails to start: the fallback of one that fails later
                self._drafter_failed(e)
        # The target's graphs as its passes will call it: with the states an EAGLE-3 head reads.
        layers = () if self.proposer is None else self.proposer.aux_layers
        self.runner.warm_up("compiling the target", **({"aux_layers": layers} if layers else {}))
        self.batches = BatchManager() if self.proposer is not None and spec.parallel else None
        self.asked_k = [0, 0]  # psd: the draft length each sub-batch's drafts in flight were asked for
        self.overlap = OverlapPolicy() if self.batches is not None and spec.overlap == "auto" else None
        self.draft_length = self._controller()
        self.trace: list[dict] | None = [] if config.trace else None
        if self.proposer is not None and spec.prefill_on_drafter:
            self.scheduler.hand_over = PROMPTS_ON_DRAFTER
        self.inputs = InputProcessor(config)
        self.tokenizer = self.inputs.tokenizer
        self.output = OutputProcessor(self.tokenizer, eos_token_ids(config.model_path, self.tokenizer),
                                      config.max_model_len)
        self.generator = make_generator(config.seed)
        self.requests: dict[str, list[Sequence]] = {}
        self._ids = itertools.count()
        self._seq_ids = itertools.count()

    # -- requests ---------------------------------------------------------------------------------

    def encode(self, prompt: str) -> list[int]:
        return self.inputs.encode(prompt)

    def apply_chat_template(self, messages: list[dict]) -> str:
        return self.inputs.apply_chat_template(messages)

    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        return self.inputs.tokenize_prompt(prompt)

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        """Queue a prompt (text or token ids); returns its request id. Bad input raises ValueError
        naming the field, and then nothing is queued: a request enters with all n sequences or none."""
        token_ids = self.inputs.process(prompt, params)
        text = prompt if isinstance(prompt, str) else None
        request_id = str(next(self._ids)) if request_id is None else request_id
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        seqs = [Sequence(next(self._seq_ids), request_id, i, text, token_ids, params,
                         None if params.seed is None else make_generator(params.seed + i),
                         self.output.detokenizer.start(len(token_ids)), logprobs=None if params.logprobs is None else [])
                for i in range(params.n)]
        for seq in seqs:
            self.scheduler.add(seq)
        self.requests[request_id] = seqs
        return request_id

    def free_slots(self) -> dict[str, int | None]:
        """Free KV slots of the target and of a draft model (None: there is none, or the drafter
        process is busy drafting)."""
        drafter = None
        if self.proposer is not None:
            try:
                drafter = self.proposer.free_slots()
            except DrafterError as e:
                self._drafter_failed(e)
        return {"target": self.runner.cache.num_free, "drafter": drafter, "num_slots": self.config.num_slots}

    def abort(self, request_id: str) -> None:
        for seq in self.requests.pop(request_id, []):
            self._finish(seq, "abort")
        self._release_drafter_slots()

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_time = time.perf_counter()
        self.scheduler.finish(seq, reason)
        if self.proposer is not None:
            self.proposer.release(seq)
        if self.batches is not None:
            self.batches.forget(seq)

    def set_num_speculative_tokens(self, k: int | str) -> None:
        """Change k (or switch to "auto") between steps: benchmarks sweep it without reloading models."""
        if self.config.speculative is None:
            raise ValueError("the engine has no speculative_config")
        check_num_speculative_tokens(k)
        self.config.speculative.num_speculative_tokens = k
        self.draft_length = self._controller()

    def _controller(self) -> DraftLengthController | None:
        """The "auto" draft-length controller (None for a fixed k); the proposer is told which, as
        under "auto" it may gate parts of itself too."""
        spec = self.config.speculative
        auto = spec is not None and spec.num_speculative_tokens == "auto"
        if self.proposer is not None:
            self.proposer.adapt(auto)
        if not auto:
            return None
        return DraftLengthController(parallel=self.batches is not None)

    def close(self) -> None:
        """Stop the drafter process, if there is one, and give back the CPU settings pinning took."""
        if self.proposer is not None:
            self.proposer.close()
        self.proposer = None
        if self.cpu_settings is not None:  # once: a later engine may have pinned them again
            restore_cpu_settings(self.cpu_settings)
            self.cpu_settings = None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # -- the step ---------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step: a decode or speculative step of the prefilled sequences, with the next chunks
        of prompts in the same target pass; returns the state of every request that advanced.
        Prompts the drafter's copy of the target prefilled join first, with their first token."""
        adopted = self._adopt_prefilled()
        step = self.scheduler.schedule()
        if step.handed_over:
            self.proposer.hand_over(step.handed_over)
        if not step:  # nothing to run here: wait for a prompt handed over, if any
            if self.scheduler.elsewhere:
                self._wait_prefilled()
            return self.output.request_outputs(self.requests, adopted)
        seqs, chunks = step.running, step.chunks
        start = time.perf_counter()
        if self.draft_length is not None and seqs:
            self.draft_length.plan(len(seqs), learn=not chunks)
        try:
            if self.proposer is None or not seqs:
                self._decode(seqs, chunks)
            elif self.draft_length is not None and self.draft_length.k == 0:
                self._undrafted_step(seqs, chunks)
            elif self.batches is not None and self._overlaps(seqs):
                seqs = self._parallel_step(seqs, chunks)
            else:
                self._speculate(seqs, chunks)
        except DrafterError as e:  # raised before any verification touched the sequences
            self._drafter_failed(e)
            self._decode(seqs, chunks)
        except Exception:  # a failed forward (or a bug): this step's sequences are in an unknown state
            log.exception("step failed; failing its %d sequences, the others go on", len(seqs) + len(chunks))
            for seq in seqs + [s for s, _ in chunks]:
                self._finish(seq, "error")
        self._release_drafter_slots()
        self.scheduler.observe(time.perf_counter() - start, bool(step.running), sum(n for _, n in chunks))
        # A prompt that is still being prefilled has nothing new to report.
        advanced = adopted + seqs + [s for s, _ in chunks if s.output_token_ids or s.status == Status.FINISHED]
        return self.output.request_outputs(self.requests, advanced)

    def _release_drafter_slots(self) -> None:
        """Send the drafter the slots of finished sequences now if it is idle. In psd, drafts in
        flight for a sub-batch whose every sequence has gone (aborted) are taken and dropped first,
        so the drafter frees their slots without waiting for another request."""
        if self.proposer is None:
            return
        try:
            if self.batches is not None and self.batches.in_flight is not None \
                    and not self.batches.size(self.batches.in_flight):
                self.proposer.collect()
                self.batches.in_flight = None
            self.proposer.flush()
        except DrafterError as e:
            self._drafter_failed(e)

    def _drafter_failed(self, error: Exception) -> None:
        """Carry on without speculation: drafts in flight are dropped, nothing else was touched;
        prompts handed over start again here."""
        log.error("drafter failed, continuing without speculation: %s", error)
        self.spec_metrics.drafter_failures += 1
        if self.proposer is not None:
            self.proposer.close(graceful=False)
        self.proposer = None
        self.batches = self.overlap = None
        self.scheduler.hand_over = 0
        self.scheduler.elsewhere.clear()

    def _adopt_prefilled(self) -> list[Sequence]:
        """Prompts the drafter's copy of the target has prefilled: their KV entries into the cache,
        then their first token, as a prompt's last chunk here would give it."""
        if self.proposer is None:
            return []
        done = self.proposer.prefilled()
        cache = self.runner.cache
        for seq, p in done:
            n = p.keys.shape[2]
            cache.k[:, seq.slot, :, :n].copy_(p.keys)
            cache.v[:, seq.slot, :, :n].copy_(p.values)
            cache.lengths[seq.slot] = n
            self.scheduler.elsewhere.discard(seq.seq_id)
        seqs = [seq for seq, _ in done]
        if seqs:
            self._sample_next(seqs, torch.cat([p.logits for _, p in done]).to(self.runner.device))
            self.spec_metrics.num_prompts_prefilled_by_drafter += len(seqs)
        return seqs

    def _wait_prefilled(self) -> None:
        try:
            self._drop_drafts_in_flight()
            self.proposer.wait_prefilled()
        except DrafterError as e:
            self._drafter_failed(e)

    @contextmanager
    def _isolated(self, seq: Sequence):
        """Work on one sequence's own results: if it fails, that sequence fails alone."""
        try:
            yield
        except Exception:
            log.exception("request %s failed", seq.request_id)
            self._finish(seq, "error")

    def _sampling_generator(self, seq: Sequence) -> torch.Generator | None:
        """The request's own generator, the engine's for unseeded requests, None for greedy ones."""
        return None if seq.params.greedy else seq.generator or self.generator

    def _decode(self, seqs: list[Sequence], chunks: list[tuple[Sequence, int]] = ()) -> None:
        """A plain decode step, one target token per sequence, beside the step's prompt chunks (a
        step of chunks alone is a prefill step in the trace)."""
        start = time.time()
        lengths = self.runner.cache.lengths
        logits, states = self._run_target(seqs, [Row(s.slot, s.tokens_from(lengths[s.slot])) for s in seqs], chunks)
        self._sample_next(seqs, logits)
        self._hand_states(seqs, states)
        self._event("decode" if seqs else "prefill", -1, len(seqs), start, time.time(), **_prompt_tokens(chunks))

    def _sample_next(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Sample and append one token per sequence from its row of `logits`."""
        tokens, _ = sample(logits, [s.params for s in seqs], [self._sampling_generator(s) for s in seqs])
        for i, (seq, token) in enumerate(zip(seqs, tokens)):
            with self._isolated(seq):
                self.append_tokens(seq, [token], self.output.logprobs(seq, logits[i : i + 1], [token]))

    def _run_target(self, seqs: list[Sequence], rows: list[Row], chunks: list[tuple[Sequence, int]] = ()
                    ) -> tuple[torch.Tensor, list | None]:
        """The target's pass over one row per sequence and, in the same pass, the step's prompt
        chunks; a prompt whose last chunk this was gets its first token here. Returns the logits of
        `rows` and, with a proposer that reads the target's states (EAGLE-3), [(first position,
        states of the row's tokens)] per row. If a pass with chunks fails, their prompts fail and
        the rows run again alone: a prompt that cannot be prefilled never takes streams with it."""
        lengths = self.runner.cache.lengths
        prompts = [(s, lengths[s.slot], n) for s, n in chunks]
        chunk_rows = [Row(s.slot, s.prompt_token_ids[start : start + n], int(start + n == len(s.prompt_token_ids)))
                      for s, start, n in prompts]
        layers = () if self.proposer is None else self.proposer.aux_layers
        starts = [lengths[s.slot] for s in seqs] + [start for _, start, _ in prompts]
        try:
            logits, states = self.runner.run(rows + chunk_rows, **({"aux_layers": layers} if layers else {}))
        except Exception:
            if not (rows and chunks):
                raise
            log.exception("a pass with %d prompt chunks failed; failing those requests, retrying the others",
                          len(chunks))
            for seq, _ in chunks:
                self._finish(seq, "error")
            return self._run_target(seqs, rows)
        if states is not None:
            states = list(zip(starts, states.split([len(r.tokens) for r in rows + chunk_rows])))
        if chunks:
            main = sum(r.num_logits for r in rows)
            self._sample_next([s for (s, _), r in zip(chunks, chunk_rows) if r.num_logits], logits[main:])
            ready = [s for s, _ in chunks if s.status != Status.FINISHED]
            self._hand_states([s for s, _ in chunks], None if states is None else states[len(rows):])
            if ready and self.proposer is not None:
                self.proposer.prefill(ready, [lengths[s.slot] for s in ready])
            logits, states = logits[:main], None if states is None else states[: len(rows)]
        return logits, states

    def _hand_states(self, seqs: list[Sequence], states: list | None) -> None:
        """Give the proposer the target's states of the tokens each sequence keeps (rejected
        drafts' states are not its own), once its new tokens are appended."""
        if states is None or self.proposer is None:
            return
        for seq, (start, rows) in zip(seqs, states):
            if seq.status != Status.FINISHED:
                self.proposer.accept_states(seq, start, rows[: max(0, len(seq) - 1 - start)])

    def _draft_len(self, seq: Sequence) -> int:
        """Drafts to make: k plus TETRIS's extra proposals, fewer near the end (`_room`)."""
        k = self._k()
        return self._room(seq, k + self._extra() if k else 0)

    def _room(self, seq: Sequence, k: int) -> int:
        """Up to k drafts, as many as fit: a round emits at most one token more than it drafts and
        must stay within max_tokens and the context."""
        room = min(seq.params.max_tokens - len(seq.output_token_ids), self.config.max_model_len - len(seq))
        return max(0, min(k, room - 1))

    def _k(self) -> int:
        return self.config.speculative.num_speculative_tokens if self.draft_length is None else self.draft_length.k

    def _extra(self) -> int:
        spec = self.config.speculative
        return spec.tetris_extra_proposals if spec.tetris else 0

    def _capacity(self, seqs: list[Sequence]) -> int | None:
        """TETRIS: how many drafts in all the batch (or sub-batch) `seqs` keeps."""
        spec = self.config.speculative
        return (spec.tetris_capacity or self._k() * len(seqs)) if spec.tetris else None

    def _speculate(self, seqs: list[Sequence], chunks: list[tuple[Sequence, int]]) -> None:
        """Standard SD: draft for every running sequence, then verify them all (psd's merged
        step: a sub-batch's drafts still in flight are dropped first)."""
        self._drop_drafts_in_flight()
        gens = [self._sampling_generator(s) for s in seqs]
        start = time.time()
        drafts, dists = self.proposer.propose(seqs, [self._draft_len(s) for s in seqs], gens, self._capacity(seqs))
        end = time.time()
        self._drafted(drafts, start, end)
        self._event("draft", 0, len(seqs), start, end)
        self._verify(seqs, drafts, dists, 0, chunks, self._k())
        self.spec_metrics.num_steps += 1

    def _parallel_step(self, running: list[Sequence], chunks: list[tuple[Sequence, int]]) -> list[Sequence]:
        """PSD: collect the in-flight sub-batch's drafts, start drafting the other sub-batch, then
        verify the first while the drafter works. Returns the verified sequences. Prompt chunks ride
        with the verification; a prompt joins a sub-batch once it is done (and has its first token)."""
        batches, drafter = self.batches, self.proposer
        batches.assign(running)
        x = batches.in_flight
        if x is None:  # nothing drafted yet (first step, or one sub-batch ran empty): no overlap
            x = 0 if batches.members(running, 0) else 1
            self._submit(batches.members(running, x), x)
        drafted = len(drafter.in_flight)
        drafts = drafter.collect()
        self._drafted([d for d, _ in drafts.values()], *drafter.last_span)
        self._event("draft", x, drafted, *drafter.last_span)
        others = batches.members(running, 1 - x)
        if others:
            self._submit(others, 1 - x)
        batches.in_flight = 1 - x if others else None
        # Every sequence of the sub-batch may have gone while it was drafted (aborted): then
        # this step verifies nothing.
        verified = batches.members(running, x)
        drafted = [drafts.get(s.seq_id, ([], None)) for s in verified]
        if verified:
            self._verify(verified, [d for d, _ in drafted], [q for _, q in drafted], x, chunks, self.asked_k[x])
        elif chunks:
            self._decode([], chunks)
        self.spec_metrics.num_steps += bool(verified)
        self.spec_metrics.num_overlapped_steps += bool(verified and others)
        batches.rebalance(self.scheduler.running, x)
        return verified

    def _overlaps(self, seqs: list[Sequence]) -> bool:
        """psd: whether this step overlaps its sub-batches; if not ("overlap": "auto" found it
        slower), it drafts and verifies every running sequence as sd does. "auto" k is told which
        schedule its step time follows."""
        overlap = self.overlap is None or self.overlap.overlap(len(seqs), len(seqs) * (self._k() + 1))
        if self.draft_length is not None:
            self.draft_length.parallel = overlap
        return overlap

    def _drop_drafts_in_flight(self) -> None:
        if self.batches is not None and self.batches.in_flight is not None:
            self.proposer.collect()
            self.batches.in_flight = None

    def _undrafted_step(self, seqs: list[Sequence], chunks: list[tuple[Sequence, int]]) -> None:
        """"auto" chose k = 0: a plain decode step over every running sequence (in psd, both
        sub-batches; drafts still in flight are collected and dropped), timed for the controller."""
        self._drop_drafts_in_flight()
        start = time.time()
        self._decode(seqs, chunks)
        if not chunks:  # the controller learns what verification costs: prompt tokens would skew it
            self.draft_length.observe_verify(time.time() - start, 0, [(0, 0)] * len(seqs), self._hindsight(seqs))

    def _hindsight(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Score the free drafts made at earlier plain steps against the tokens emitted since, and
        make the next ones (spec_decode/hindsight.py)."""
        hindsight = self.draft_length.hindsight
        scored = hindsight.score(seqs)
        undrafted = hindsight.undrafted([s for s in seqs if s.status != Status.FINISHED])
        drafts = self.proposer.free_drafts(undrafted, hindsight.k) if undrafted else None
        if drafts is not None:
            hindsight.propose(undrafted, drafts)
        return scored

    def _drafted(self, drafts: list[list[int]], start: float, end: float) -> None:
        if self.draft_length is not None:
            self.draft_length.observe_draft(end - start, max(map(len, drafts), default=0))
        if self.overlap is not None and drafts:
            self.overlap.observe_draft(len(drafts), end - start)

    def _submit(self, seqs: list[Sequence], group: int) -> None:
        self.asked_k[group] = self._k()
        self.proposer.submit(seqs, [self._draft_len(s) for s in seqs], self._capacity(seqs))

    def _verify(self, seqs: list[Sequence], drafts: list[list[int]], dists: list[Dist | None],
                group: int, chunks: list[tuple[Sequence, int]], k: int) -> None:
        """One target pass over every row's drafts, drafted at length k (and the step's prompt
        chunks); keep what rejection sampling accepts."""
        start = time.time()
        learn = self.draft_length is not None and not chunks  # "auto" learns from this verification
        # A row given fewer drafts than asked (a prompt lookup that found nothing, a gated model, a
        # TETRIS cut) counts for "auto" as drafting them all with the missing ones rejected, as no
        # token came of them: it weighs what asking for k yields. Taken before the rows grow.
        asked = [max(len(d), self._room(s, k)) for s, d in zip(seqs, drafts)] if learn else []
        gens = [self._sampling_generator(s) for s in seqs]
        cache = self.runner.cache
        rows = [Row(s.slot, s.tokens_from(cache.lengths[s.slot]) + d, len(d) + 1) for s, d in zip(seqs, drafts)]
        logits, states = self._run_target(seqs, rows, chunks)
        drafted = [len(d) for d in drafts]
        accepted = [0] * len(seqs)
        for i, (seq, d, q, gen, row_logits) in enumerate(zip(seqs, drafts, dists, gens,
                                                             logits.split([n + 1 for n in drafted]))):
            with self._isolated(seq):
                if gen is None:  # greedy: the target's argmax, no distribution built
                    tokens = greedy_verify(row_logits.argmax(dim=-1).tolist(), d)
                else:
                    tokens = rejection_sample(probabilities(row_logits, [seq.params] * (len(d) + 1)), q, d, gen)
                accepted[i] = len(tokens) - 1
                self.spec_metrics.observe(len(d), len(tokens) - 1)
                self.append_tokens(seq, tokens, self.output.logprobs(seq, row_logits[: len(tokens)], tokens))
                if seq.status != Status.FINISHED:  # drop the target's KV entries of rejected drafts
                    cache.truncate(seq.slot, len(seq) - 1)
        self._hand_states(seqs, states)
        end = time.time()
        self.proposer.observe_verify(end - start)
        if learn:
            self.draft_length.observe_verify(end - start, k, list(zip(asked, accepted)))
        if self.overlap is not None:
            self.overlap.observe_verify(sum(drafted) + len(seqs) + sum(n for _, n in chunks), end - start)
        self._event("verify", group, len(seqs), start, end, drafted=drafted, accepted=accepted,
                    **_prompt_tokens(chunks))

    def _event(self, kind: str, group: int, size: int, start: float, end: float, **extra) -> None:
        """Append to the opt-in step trace: who (target: prefill, decode or verify; drafter: draft)
        worked on which sub-batch (-1: none) of how many sequences, from when to when (wall clock)."""
        if self.trace is not None:
            self.trace.append({"kind": kind, "group": group, "size": size, "start": start, "end": end, **extra})

    def append_tokens(self, seq: Sequence, tokens: list[int], logprobs: list[dict[int, float]] | None = None) -> None:
        """Append generated tokens, finishing the sequence (and freeing its slot) at the first stop."""
        reason = self.output.append(seq, tokens, logprobs)
        if reason is not None:
            self._finish(seq, reason)


def _prompt_tokens(chunks: list[tuple[Sequence, int]]) -> dict:
    """The trace's note of the prompt tokens a step carried."""
    return {"prompt_tokens": sum(n for _, n in chunks)} if chunks else {}
