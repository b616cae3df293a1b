"""PSDScheduler: vLLM's scheduler with MineDraft's drafter process drafting one sub-batch of the
running requests while vLLM's model worker verifies the other (batch parallel speculative decoding).

vLLM builds it in its EngineCore process (`scheduler_cls`). Before every step it:
1. collects the drafts of the sub-batch the drafter worked on during the previous step and writes
   them into those requests' `spec_token_ids`, where vLLM's model runner and rejection sampler
   verify them like any other drafts;
2. sends the other sub-batch's new tokens to the drafter and keeps those requests out of this step
   (`Request.next_decode_eligible_step`, the hook vLLM's own pipelined schedulers use);
3. runs vLLM's own `schedule()`. Prompts being prefilled belong to neither sub-batch: their chunks
   ride along with every step, and their tokens reach the drafter as they are computed.

Only `spec_token_ids` is ever written, so output is vLLM's own: drafts change speed, never tokens.
A drafter that dies or stops answering means no more drafts (one warning), never a failed request.
"""

import json
import os
import time
from pathlib import Path

from vllm.logger import init_logger
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import Request, RequestStatus

from minedraft.config import DTYPES
from minedraft.engine.batch_manager import BatchManager
from minedraft.engine.detokenizer import DecodeState
from minedraft.engine.sequence import Sequence
from minedraft.sampling import SamplingParams
from minedraft.spec_decode.remote import RemoteDrafter, WorkerArgs, free_port
from minedraft.spec_decode.transport import DrafterError
from minedraft.vllm import PROPOSER, check_version

logger = init_logger(__name__)

# vLLM's rejection sampler never sees draft probabilities on this route (it treats every draft as
# certain, which is lossless for any draft source), so the drafter drafts greedily.
GREEDY = SamplingParams(temperature=0.0)


class PSDScheduler(Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        check_version()
        config = self.vllm_config
        settings = _settings(config)
        self.k = config.speculative_config.num_speculative_tokens
        self.vocab_size = config.model_config.get_vocab_size()
        self.max_model_len = config.model_config.max_model_len
        self.parallel = settings["parallel"]
        self.batches = BatchManager() if self.parallel else None
        self.mirrors: dict[str, Sequence] = {}  # req_id -> what the drafter knows of the request
        self.submitted: dict[str, int] = {}  # req_id -> its token count when sent to be drafted
        self.by_seq: dict[int, str] = {}  # the drafter's seq_id -> req_id
        self.verified: int | None = None  # the sub-batch this step verifies
        self.target_start: float | None = None
        self.target_span: tuple[float, float] | None = None  # the last step's model pass, wall clock
        self.next_seq_id = 0
        self.totals = {"steps": 0, "overlapped_steps": 0, "draft_s": 0.0, "target_s": 0.0, "overlap_s": 0.0,
                       "draft_tokens": 0, "accepted_tokens": 0}
        self.trace = None if settings["trace"] is None else open(settings["trace"], "a", buffering=1)
        dtype = str(config.model_config.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"MineDraft's drafter runs in one of {sorted(DTYPES)}, not the target's {dtype}")
        args = WorkerArgs(model_path=settings["draft_model"], target_path=str(Path(config.model_config.model)),
                          dtype=dtype, device=settings["draft_device"], num_slots=self.max_num_running_reqs,
                          max_len=self.max_model_len, cpus=settings["draft_cpus"],
                          init_method=f"tcp://127.0.0.1:{free_port()}", seed=config.model_config.seed or 0,
                          compile_sizes=[], cuda_graphs=not config.model_config.enforce_eager)
        self.drafter: RemoteDrafter | None = RemoteDrafter(args, settings["timeout_s"])
        self._record("start", drafter_pid=self.drafter.process.pid, parallel=self.parallel, k=self.k)

    # vLLM's hooks

    def schedule(self, throttle_prefills: bool = False):
        if self.drafter is not None:
            try:
                self._release_gone()
                self._draft()
            except DrafterError as e:
                self._drafter_died(e)
        out = super().schedule(throttle_prefills)
        for req_id in out.preempted_req_ids:  # preempted in this call: it starts over later
            self._release(req_id)
        self._record("schedule", group=self.verified, scheduled=sorted(out.num_scheduled_tokens),
                     spec={r: len(t) for r, t in out.scheduled_spec_decode_tokens.items()},
                     in_flight=self._in_flight_ids(), preempted=sorted(out.preempted_req_ids))
        self.target_start = time.time()
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        end = time.time()
        accepted = {}
        for req_id in scheduler_output.scheduled_spec_decode_tokens:
            index = model_runner_output.req_id_to_index.get(req_id)
            if index is not None and model_runner_output.sampled_token_ids:
                accepted[req_id] = max(len(model_runner_output.sampled_token_ids[index]) - 1, 0)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self.target_start is not None and scheduler_output.total_num_scheduled_tokens:
            self.target_span = (self.target_start, end)
            self.totals["target_s"] += end - self.target_start
            self.totals["draft_tokens"] += sum(len(d) for d in scheduler_output.scheduled_spec_decode_tokens.values())
            self.totals["accepted_tokens"] += sum(accepted.values())
            self._record("verify", group=self.verified, start=self.target_start, end=end, accepted=accepted)
        if self.drafter is not None:
            try:
                self._after_step()
                if not self.has_unfinished_requests():
                    self._record_idle()
            except DrafterError as e:
                self._drafter_died(e)
        return outputs

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        """The worker's NullProposer drafted nothing: the drafts come from `schedule()`."""

    def shutdown(self) -> None:
        logger.info("MineDraft PSD totals: %s", self.totals)
        stats = None
        if self.drafter is not None:
            try:
                stats = self._drafter_stats()
            except DrafterError as e:
                logger.warning("MineDraft's drafter failed while stopping: %s", e)
            self.drafter.close(graceful=stats is not None)
            self.drafter = None
        self._record("stop", totals=self.totals, drafter=stats)
        if self.trace is not None:
            self.trace.close()
            self.trace = None
        super().shutdown()

    # drafting

    def _draft(self) -> None:
        """Collect the in-flight sub-batch's drafts and send the other one (psd), or draft every
        decoding request and wait (sequential)."""
        ready = [self._mirror(r) for r in self.running if _decoding(r)]
        if not self.parallel:
            self.verified = 0
            if ready:
                self.totals["steps"] += 1
                self._submit(ready)
                self._inject(self.drafter.collect())
            return
        batches = self.batches
        batches.assign(ready)
        x = batches.in_flight
        if x is None:  # nothing drafted yet (first step, or a sub-batch ran empty): no overlap
            x = 0 if batches.members(ready, 0) else 1
            if not batches.members(ready, x):
                self.verified = None
                return
            self._submit(batches.members(ready, x))
        self._inject(self.drafter.collect())
        others = batches.members(ready, 1 - x)
        if others:
            self._submit(others)
            for seq in others:  # kept out of this step; vLLM increments current_step first
                self.requests[seq.request_id].next_decode_eligible_step = self.current_step + 2
        batches.in_flight = 1 - x if others else None
        self.verified = x
        self.totals["steps"] += 1
        self.totals["overlapped_steps"] += bool(others)

    def _submit(self, seqs: list[Sequence]) -> None:
        lengths = []
        for seq in seqs:
            request = self.requests[seq.request_id]
            self.submitted[seq.request_id] = request.num_tokens
            request.spec_token_ids = []  # until fresh drafts arrive
            room = min(request.max_tokens - request.num_output_tokens, self.max_model_len - request.num_tokens)
            lengths.append(max(0, min(self.k, room - 1)))
        self.drafter.submit(seqs, lengths)

    def _inject(self, drafts: dict[int, tuple[list[int], object]]) -> None:
        """The drafts of requests still as they were when sent, cut at the first id outside the
        vocabulary, through vLLM's own setter (it skips finished requests and prefill chunks)."""
        start, end = self.drafter.last_span
        self._record("draft", start=start, end=end, size=len(drafts))
        self.totals["draft_s"] += end - start
        if self.target_span is not None:
            self.totals["overlap_s"] += max(0.0, min(end, self.target_span[1]) - max(start, self.target_span[0]))
        ids, lists = [], []
        for seq_id, (tokens, _) in drafts.items():
            req_id = self.by_seq.get(seq_id)
            request = self.requests.get(req_id) if req_id is not None else None
            if request is None or not _decoding(request) or request.num_tokens != self.submitted.get(req_id):
                continue
            valid = next((i for i, t in enumerate(tokens) if not 0 <= t < self.vocab_size), len(tokens))
            ids.append(req_id)
            lists.append(tokens[: min(valid, self.k)])
        Scheduler.update_draft_token_ids(self, DraftTokenIds(ids, lists))

    def _after_step(self) -> None:
        """Rebalance the sub-batches, and send the drafter what prompts were computed (it prefills
        them while it has nothing else to do)."""
        chunks = [(self._mirror(r), r.num_computed_tokens) for r in self.running
                  if r.status == RequestStatus.RUNNING and not _decoding(r) and r.num_computed_tokens > 0]
        if chunks:
            self.drafter.prefill([s for s, _ in chunks], [n for _, n in chunks])
        if self.batches is not None and self.verified is not None:
            ready = [self.mirrors[r.request_id] for r in self.running if r.request_id in self.mirrors and _decoding(r)]
            self.batches.rebalance(ready, self.verified)
        self.drafter.flush()

    # bookkeeping

    def _mirror(self, request: Request) -> Sequence:
        """The drafter's view of `request`, brought up to date with its verified tokens."""
        seq = self.mirrors.get(request.request_id)
        if seq is None:
            seq = Sequence(self.next_seq_id, request.request_id, 0, None, list(request.prompt_token_ids), GREEDY,
                           None, DecodeState(0, 0))
            self.next_seq_id += 1
            self.mirrors[request.request_id] = seq
            self.by_seq[seq.seq_id] = request.request_id
        done = len(seq.output_token_ids)
        seq.output_token_ids.extend(request.output_token_ids[done:])
        return seq

    def _release_gone(self) -> None:
        """Forget requests that finished, were aborted or were preempted since the last step."""
        for req_id in list(self.mirrors):
            request = self.requests.get(req_id)
            if request is None or request.status != RequestStatus.RUNNING:
                self._release(req_id)

    def _release(self, req_id: str) -> None:
        seq = self.mirrors.pop(req_id, None)
        self.submitted.pop(req_id, None)
        if seq is not None:
            self.by_seq.pop(seq.seq_id, None)
            if self.drafter is not None:
                self.drafter.release(seq)
            if self.batches is not None:
                self.batches.forget(seq)
            self._record("release", request=req_id)

    def _in_flight_ids(self) -> list[str]:
        if self.drafter is None or self.drafter.in_flight is None:
            return []
        return sorted(s.request_id for s in self.drafter.in_flight)

    def _drafter_died(self, error: DrafterError) -> None:
        logger.warning("MineDraft's drafter failed (%s); vLLM goes on without speculation", error)
        self._record("drafter_dead", error=str(error))
        self.drafter.close(graceful=False)
        self.drafter, self.verified = None, None
        for req_id in self.mirrors:  # none waits for drafts any more
            request = self.requests.get(req_id)
            if request is not None:
                request.next_decode_eligible_step = 0
        self.mirrors.clear()
        self.by_seq.clear()

    def _record_idle(self) -> None:
        """With no request left, release what finished and record the totals and the drafter's
        state now: vLLM may kill its engine core before `shutdown()` has written them."""
        self._release_gone()
        if self.batches is not None:
            self.batches.in_flight = None  # _drafter_stats takes (and drops) drafts still in flight
        self._record("idle", totals=dict(self.totals), drafter=self._drafter_stats())

    def _drafter_stats(self) -> dict:
        if self.drafter.in_flight is not None:
            self.drafter.collect()
        self.drafter.flush()
        return self.drafter.stats()

    def _record(self, kind: str, **fields) -> None:
        if self.trace is not None:
            self.trace.write(json.dumps({"kind": kind, "step": self.current_step, "time": time.time(), **fields}) + "\n")


def _decoding(request: Request) -> bool:
    """Whether `request` is past its prompt with every token but the last sampled one computed."""
    return (request.status == RequestStatus.RUNNING and request.num_output_tokens > 0
            and request.num_computed_tokens == request.num_tokens - 1)


def _settings(config) -> dict:
    """The plugin's settings (from `minedraft.vllm.engine_args`), after refusing what it cannot run."""
    settings = (config.additional_config or {}).get("minedraft")
    if not isinstance(settings, dict):
        raise ValueError("PSDScheduler needs additional_config={'minedraft': {...}}: make vLLM's arguments "
                         "with minedraft.vllm.engine_args(...) or `minedraft vllm-args`")
    spec = config.speculative_config
    if spec is None or spec.method != "custom_class" or spec.model != PROPOSER:
        raise ValueError(f"PSDScheduler needs speculative_config method 'custom_class' with model {PROPOSER!r}")
    if config.scheduler_config.async_scheduling:
        raise ValueError("PSDScheduler needs synchronous scheduling (async_scheduling=False)")
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":
        raise ValueError("PSDScheduler needs vLLM's V1 model runner: unset VLLM_USE_V2_MODEL_RUNNER")
    if config.parallel_config.pipeline_parallel_size > 1:
        raise ValueError("PSDScheduler does not support pipeline parallelism")
    return settings
