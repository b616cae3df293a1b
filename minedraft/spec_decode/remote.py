"""The engine's handle on a drafter in its own process (minedraft.spec_decode.worker), on its own
cores or GPU, reached through torch.distributed.

Draft requests are keyed by sequence id and carry only the sequence's tokens the drafter has not
been sent yet; its proposer works out which of its KV entries (accepted drafts) stay valid.
"""

import atexit
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass

import torch

from minedraft.spec_decode.base import Prefilled, Proposer
from minedraft.spec_decode.ngram import NgramProposer
from minedraft.spec_decode.transport import ENGINE, Channel, DrafterError
from minedraft.engine.sequence import Sequence
from minedraft.sampling import Dist


@dataclass(frozen=True)
class WorkerArgs:
    model_path: str
    target_path: str  # a drafter may share its target's input embedding
    dtype: str  # a name in minedraft.config.DTYPES
    device: str
    num_slots: int
    max_len: int
    cpus: list[int] | None
    init_method: str
    seed: int
    compile_sizes: list[int]  # the drafter's compiled forward (EngineConfig.compile_sizes)
    cuda_graphs: bool  # the drafter's CUDA graphs on a GPU (not EngineConfig.enforce_eager)
    prompt_lookup: list[int] | None = None  # [min, max] n-gram sizes of a lookup in front of the model
    prefill_target: bool = False  # a copy of the target prefills handed-over prompts (spec_decode/target_prefill.py)


READY_TIMEOUT_S = 600.0  # for the drafter process to start, load its model and compile its forward pass


def pin(cpus: tuple[int, ...] | None) -> None:
    """Bind this thread (and the threads it starts) to `cpus`, with one torch thread per core."""
    if cpus:
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))


def cpu_settings() -> tuple[int, set[int], int]:
    """What pin() changes: this thread's id and cores, and torch's thread count (process-wide)."""
    return threading.get_native_id(), os.sched_getaffinity(0), torch.get_num_threads()


def restore_cpu_settings(settings: tuple[int, set[int], int]) -> None:
    thread, cpus, num_threads = settings
    try:
        os.sched_setaffinity(thread, cpus)
    except OSError:  # that thread has ended
        pass
    torch.set_num_threads(num_threads)


def drafter_seed(seed: int, index: int) -> int:
    """The drafter's seed for a seeded request. Its stream must not be the engine's (seed + index):
    drafts and acceptance draws would be correlated and sampling would no longer be lossless."""
    return (seed * 0x9E3779B97F4A7C15 + index + 1) % 2**63


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Drafters not closed yet, closed by the hook below when the program ends, however it ends (unless
# killed). atexit hooks run before the interpreter finalizes: a drafter closed by a __del__ during
# finalization sends its "stop" message then, and when the Python tensors of a message gloo still
# holds are freed there, torch's check in THPVariable_clear aborts the process (SIGABRT, issue 54).
_open: "weakref.WeakSet[RemoteDrafter]" = weakref.WeakSet()


@atexit.register
def _close_open_drafters() -> None:
    for drafter in list(_open):
        drafter.close()


class RemoteDrafter(Proposer):
    """Engine-side handle on the drafter process: submit a sub-batch, later collect its drafts."""

    def __init__(self, args: WorkerArgs, timeout_s: float, aux_layers: tuple[int, ...] = (),
                 lookup: NgramProposer | None = None):
        self.timeout_s = timeout_s
        self.aux_layers = aux_layers  # an EAGLE-3 head's: the target's states travel with the tokens
        self.lookup = lookup  # the prompt lookup the drafter puts first, if any: run here for `free_drafts`
        self.states: dict[int, tuple[int, list[torch.Tensor]]] = {}  # seq_id -> (first position, not yet sent)
        # A fresh interpreter (not multiprocessing's spawn) so the user's __main__ is never re-run;
        # the same command could start the drafter on another host.
        command = [sys.executable, "-m", "minedraft.spec_decode.worker", json.dumps(dataclasses.asdict(args))]
        self.known: dict[int, int] = {}  # seq_id -> how many of the sequence's tokens the drafter has
        self.prefills: dict[int, tuple[Sequence, int]] = {}  # seq_id -> (sequence, tokens to prefill up to)
        self.released: list[int] = []
        self.handed: dict[int, Sequence] = {}  # seq_id -> a prompt handed over, until it comes back
        self.to_hand: list[int] = []  # those of them not sent yet
        self.done: list[tuple[Sequence, Prefilled]] = []
        self.idle_s = 0.0  # the target's last verification: the drafter's time for handed-over prompts
        self.adapting: bool | None = None  # "auto" set or unset, for the drafter's next message
        self.free = False  # the drafter's last answer: its drafts then cost nothing (its lookup alone)
        self.in_flight: list[Sequence] | None = None
        self.last_span: tuple[float, float] | None = None
        self.process = subprocess.Popen(command)
        self.channel = None
        _open.add(self)
        try:
            self.channel = Channel(args.init_method, ENGINE, READY_TIMEOUT_S, lambda: self.process.poll() is None)
            self.channel.recv(READY_TIMEOUT_S)
        except DrafterError as e:
            self.close()
            raise DrafterError(f"drafter process failed to start: {e}") from None

    def propose(
        self, seqs: list[Sequence], num_tokens: list[int], generators: list[torch.Generator | None],
        capacity: int | None = None,
    ) -> tuple[list[list[int]], list[Dist | None]]:
        """Draft-then-wait, the in-process proposer's interface (the drafter samples with its own
        generators, so `generators` is not used)."""
        self.submit(seqs, num_tokens, capacity)
        out = self.collect()
        return [out[s.seq_id][0] for s in seqs], [out[s.seq_id][1] for s in seqs]

    def submit(self, seqs: list[Sequence], num_tokens: list[int], capacity: int | None = None) -> None:
        """Start drafting for `seqs` (TETRIS: keeping `capacity` drafts in all); the drafter seeds
        seeded requests' generators the same way. Queued prompt chunks go first, for it to prefill."""
        header, states = self._update("draft")
        items, more = self._items([(seq, len(seq)) for seq in seqs])
        header.update(seqs=items, num_tokens=num_tokens, capacity=capacity, idle_s=self.idle_s)
        self._send(header, [torch.cat(states + more)] if states or more else [])
        self.in_flight = seqs

    def prefill(self, seqs: list[Sequence], ends: list[int]) -> None:
        """Queued for the next message: the drafter prefills them beside its next drafts."""
        for seq, end in zip(seqs, ends):
            self.prefills[seq.seq_id] = (seq, end)

    def hand_over(self, seqs: list[Sequence]) -> None:
        """Queued for the next message: the drafter's copy of the target prefills their prompts."""
        for seq in seqs:
            self.handed[seq.seq_id] = seq
            self.to_hand.append(seq.seq_id)

    def prefilled(self) -> list[tuple[Sequence, Prefilled]]:
        done, self.done = self.done, []
        return done

    def wait_prefilled(self) -> None:
        if self.in_flight is not None:
            raise RuntimeError("the drafter is drafting; wait for prompts when it is idle")
        if self.handed and not self.done:
            header, states = self._update("prefilled")
            self._send(header, [torch.cat(states)] if states else [])
            self._take_prefilled(*self._recv())

    def observe_verify(self, seconds: float) -> None:
        self.idle_s = seconds

    def adapt(self, on: bool) -> None:
        """Sent with the next message: the drafter's proposer adapts in its own process."""
        self.adapting = on

    def choices(self) -> dict:
        return {} if self.in_flight is not None else self.stats()["choices"]

    def free_drafts(self, seqs: list[Sequence], k: int) -> list[list[int]] | None:
        """The drafter's prompt lookup, run here, while its last answer said the lookup drafts alone."""
        return self.lookup.free_drafts(seqs, k) if self.free and self.lookup is not None else None

    def _update(self, op: str) -> tuple[dict, list[torch.Tensor]]:
        """A message's header with the queued releases, prompt chunks and prompts handed over, and
        the chunks' states."""
        handed = [(self.handed[i], len(self.handed[i].prompt_token_ids)) for i in self.to_hand]
        items, states = self._items(list(self.prefills.values()) + handed)
        header = {"op": op, "release": self.released, "prefill": items, "on_target": self.to_hand}
        if self.adapting is not None:
            header["adapt"], self.adapting = self.adapting, None
        self.released, self.prefills, self.to_hand = [], {}, []
        return header, states

    def _items(self, seqs: list[tuple[Sequence, int]]) -> tuple[list, list[torch.Tensor]]:
        """What the drafter has not been sent of each sequence up to its token `end`: the tokens,
        how to sample it and the target's states (then the span of positions they cover)."""
        items, states = [], []
        for seq, end in seqs:
            gen_seed = None if seq.params.seed is None else drafter_seed(seq.params.seed, seq.index)
            known = self.known.get(seq.seq_id, 0)
            span = None
            if seq.seq_id in self.states:
                # Only the states of positions whose tokens go too: a prompt queued up to its end
                # may have decoded on (plain steps) before this message.
                start, held = self.states.pop(seq.seq_id)
                held = torch.cat(held)
                n = max(0, min(len(held), end - start))
                if n:
                    states.append(held[:n])
                    span = [start, n]
                if n < len(held):
                    self.states[seq.seq_id] = (start + n, [held[n:]])
            items.append([seq.seq_id, seq.tokens_from(known)[: end - known], seq.params.as_dict(), gen_seed, span])
            self.known[seq.seq_id] = end
        return items, states

    def collect(self) -> dict[int, tuple[list[int], Dist | None]]:
        """Drafts and draft distributions (None for greedy rows) of the in-flight sub-batch, by seq id."""
        seqs, self.in_flight = self.in_flight, None
        header, tensors = self._take_prefilled(*self._recv())
        try:
            self.last_span = (float(header["start"]), float(header["end"]))
            self.free = bool(header.get("free"))
            drafts = header["drafts"]
            if len(drafts) != len(seqs) or any(not isinstance(t, int) for d in drafts for t in d):
                raise ValueError(f"{len(drafts)} drafts for {len(seqs)} sequences, or not token ids")
            q, out, row = _received_dists(header, tensors), {}, 0
            for seq, d in zip(seqs, drafts):  # greedy rows came as token ids alone
                n = 0 if seq.params.greedy else len(d)
                out[seq.seq_id] = (d, q[row : row + n] if n else None)
                row += n
            if row != (0 if q is None else len(q)):
                raise ValueError(f"{0 if q is None else len(q)} draft distributions for {row} sampled drafts")
            return out
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
            raise DrafterError(f"malformed drafts from the drafter: {e!r}") from None

    def _take_prefilled(self, header: dict, tensors: list[torch.Tensor]) -> tuple[dict, list[torch.Tensor]]:
        """Keep the prompts an answer brings back prefilled (its last 3 tensors: keys and values
        back to back, last logits); returns the answer without them."""
        done = header.get("prefilled")
        if not done:
            return header, tensors
        try:
            keys, values, logits = tensors[-3:]
            lengths = [n for _, n in done]
            ok = len(tensors) >= 3 and keys.shape == values.shape and keys.dim() == 4 and logits.dim() == 2
            ok = ok and keys.shape[2] == sum(lengths) and len(logits) == len(done)
            if not ok:
                raise ValueError("KV entries or logits whose shape does not fit")
            for (seq_id, n), k, v, row in zip(done, keys.split(lengths, 2), values.split(lengths, 2), logits):
                seq = self.handed.pop(seq_id, None)
                if seq is None:  # released since (aborted)
                    continue
                if n != len(seq.prompt_token_ids):
                    raise ValueError(f"{n} KV entries for a prompt of {len(seq.prompt_token_ids)} tokens")
                self.done.append((seq, Prefilled(seq_id, k, v, row[None])))
        except (TypeError, ValueError, RuntimeError) as e:
            raise DrafterError(f"malformed prefilled prompts from the drafter: {e!r}") from None
        return header, tensors[:-3]

    def accept_states(self, seq: Sequence, start: int, states: torch.Tensor) -> None:
        """Kept until the sequence's next draft request, which carries them."""
        if seq.seq_id in self.states:
            self.states[seq.seq_id][1].append(states)
        elif len(states):
            self.states[seq.seq_id] = (start, [states])

    def release(self, seq: Sequence) -> None:
        self.states.pop(seq.seq_id, None)
        self.prefills.pop(seq.seq_id, None)
        if self.handed.pop(seq.seq_id, None) is not None and seq.seq_id in self.to_hand:
            self.to_hand.remove(seq.seq_id)
        self.done = [(s, p) for s, p in self.done if s.seq_id != seq.seq_id]
        if self.known.pop(seq.seq_id, None) is not None:
            self.released.append(seq.seq_id)

    def flush(self) -> None:
        """Send queued releases and prompt chunks now, if the drafter is idle (it prefills while
        the target works on; its answer to the next message waits for that)."""
        if (self.released or self.prefills or self.to_hand) and self.in_flight is None:
            header, states = self._update("update")
            self._send(header, [torch.cat(states)] if states else [])

    def free_slots(self) -> int | None:
        """The drafter process's free slots, when it is idle (asking it costs a round trip)."""
        return None if self.in_flight is not None else self.stats()["free_slots"]

    def stats(self) -> dict:
        """The idle drafter's free KV slots, the sequences it holds, their tokens it has been sent and
        what its proposer chose for itself under "auto"."""
        if self.in_flight is not None:
            raise RuntimeError("the drafter is drafting; ask for its stats when it is idle")
        self._send({"op": "stats"})
        return self._recv()[0]

    def close(self, graceful: bool = True) -> None:
        """Stop the drafter process: asked to stop, or killed (after a failure, if it won't, or if a
        message was cut off midway, as by Ctrl-C, so that the channel is out of step)."""
        _open.discard(self)
        if self.process.poll() is None:
            try:
                if self.channel is None or self.channel.broken or not graceful:
                    raise DrafterError("not stopping gracefully")
                if self.in_flight is not None:  # it listens again only once its drafts are taken
                    self.collect()
                self.channel.send({"op": "stop"})
                self.process.wait(timeout=10)
            except (DrafterError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()

    def _send(self, header: dict, tensors: list[torch.Tensor] = ()) -> None:
        self._check_alive()
        self.channel.send(header, tensors)

    def _recv(self) -> tuple[dict, list[torch.Tensor]]:
        self._check_alive()
        return self.channel.recv(self.timeout_s)

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise DrafterError(f"drafter process exited with code {self.process.returncode}")


def _received_dists(header: dict, tensors: list[torch.Tensor]) -> Dist | None:
    """The draft distributions of a drafter's answer, rows of every sampled sequence's drafts in
    order: probabilities, and the token ids they are over when compact (see the worker)."""
    if not tensors:
        return None
    probs, ids, vocab = tensors[0], tensors[1] if len(tensors) > 1 else None, header["vocab"]
    if not isinstance(vocab, int) or not probs.is_floating_point() or probs.dim() != 2:
        raise ValueError("draft probabilities of the wrong type or shape")
    if ids is None:
        ok = probs.shape[1] == vocab
    else:
        ok = ids.dtype == torch.int64 and ids.shape[-1] == probs.shape[1] and ids.shape[:-1] in ((), probs.shape[:1])
        ok = ok and (ids.numel() == 0 or 0 <= int(ids.min()) <= int(ids.max()) < vocab)
    if not ok:
        raise ValueError("draft distributions whose shape or token ids do not fit")
    return Dist(probs, ids, vocab)
