"""The drafter process: `python -m minedraft.spec_decode.worker ARGS_JSON`, started by RemoteDrafter.

It keeps a mirror of each sequence's verified tokens (sent by the engine a few at a time), and for
an EAGLE-3 head the target's states of them, and a proposer over its own KV cache, and answers
draft requests until told to stop.
"""

import ctypes
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from minedraft.config import DTYPES
from minedraft.spec_decode.base import Proposer
from minedraft.spec_decode.draft_model import DraftModelProposer
from minedraft.spec_decode.eagle3 import Eagle3Proposer
from minedraft.spec_decode.ngram import LookupFirst, NgramProposer
from minedraft.spec_decode.remote import WorkerArgs, pin
from minedraft.spec_decode.target_prefill import TargetPrefill
from minedraft.spec_decode.transport import DRAFTER, Channel
from minedraft.engine.sequence import Sequence
from minedraft.models.eagle3 import is_eagle3, load_eagle3
from minedraft.models.draft_format import uses_target_embedding
from minedraft.models.loader import load_model, read_config, read_embedding
from minedraft.sampling import Dist, SamplingParams, make_generator


def die_with_parent() -> None:
    """Ask Linux to kill this process when the engine that started it dies, however it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def make_proposer(args: WorkerArgs, device: torch.device, dtype: torch.dtype) -> Proposer:
    """A draft model, or an EAGLE-3 head (both may read the target's input embedding), with prompt
    lookup in front of it if asked."""
    draft_path, target_path = Path(args.model_path), Path(args.target_path)
    config = read_config(draft_path)
    sizes, compiled = tuple(args.compile_sizes), bool(args.compile_sizes)
    if is_eagle3(config):
        head = load_eagle3(draft_path, dtype, device, read_embedding(target_path), compiled=compiled)
        target_layers = read_config(target_path)["num_hidden_layers"]
        model: Proposer = Eagle3Proposer(head, target_layers, args.num_slots, args.max_len, dtype, device, sizes,
                                         args.cuda_graphs)
    else:
        embedding = read_embedding(target_path) if uses_target_embedding(config) else None
        model = DraftModelProposer(load_model(draft_path, dtype, device, embedding, compiled=compiled), args.num_slots,
                                   args.max_len, dtype, device, sizes, args.cuda_graphs)
    if args.prompt_lookup is None:
        return model
    return LookupFirst(model, NgramProposer(*args.prompt_lookup, config["vocab_size"], dtype))


# Tokens a drafted sequence may have to catch up on before it waits a round (see Drafter.handle):
# a round brings at most k + 1 per sequence; a prompt's chunk brings hundreds.
MAX_CATCH_UP = 16


def worker_main(args: WorkerArgs) -> None:
    die_with_parent()
    # Ctrl-C in a terminal signals the engine and its drafter alike; the engine stops the drafter.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pin(args.cpus)
    channel = Channel(args.init_method, DRAFTER, timeout_s=24 * 3600)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    proposer = make_proposer(args, device, dtype)
    target = None
    if args.prefill_target:
        model = load_model(Path(args.target_path), dtype, device)
        target = TargetPrefill(model, args.max_len, dtype, device, proposer.aux_layers)
    drafter = Drafter(proposer, make_generator(args.seed), channel.send, target)
    channel.send({"ready": True})
    while drafter.handle(*channel.recv()):
        pass


class Drafter:
    """The worker's state between messages: the proposer, a mirror of each sequence, where
    answers go (`send(header, tensors)`) and, with "prefill_on_drafter", the target's copy."""

    def __init__(self, proposer: Proposer, default_gen: torch.Generator, send: Callable[..., None],
                 target: TargetPrefill | None = None):
        self.proposer = proposer
        self.default_gen = default_gen
        self.send = send
        self.target = target
        self.mirrors: dict[int, Sequence] = {}

    def handle(self, header: dict, tensors: list[torch.Tensor]) -> bool:
        """Act on one message of the engine's; False once told to stop."""
        proposer = self.proposer
        received = time.time()
        for seq_id in header.get("release", ()):
            if seq_id in self.mirrors:
                proposer.release(self.mirrors.pop(seq_id))
            if self.target is not None:
                self.target.drop(seq_id)
        if "adapt" in header:
            proposer.adapt(header["adapt"])
        op = header["op"]
        if op == "stop":
            return False
        if op == "stats":
            self.send({"free_slots": proposer.free_slots(), "sequences": len(self.mirrors),
                       "tokens": sum(len(seq) for seq in self.mirrors.values()), "choices": proposer.choices()})
            return True
        start = time.time()
        items = header.get("prefill", []) + header.get("seqs", [])
        states = iter(tensors[0].split([span[1] for *_, span in items if span]) if tensors else ())
        seqs = [update_mirror(self.mirrors, item, proposer, states) for item in items]
        split = len(header.get("prefill", []))
        prefilled, seqs = seqs[:split], seqs[split:]
        for seq_id in header.get("on_target", ()):
            self.target.add(self.mirrors[seq_id])
        if op == "prefilled":  # the engine has nothing else to do: one prompt, then the answer
            self.target.run(proposer, None)
            self.send(*self._prefilled({}, []))
            return True
        if op == "draft":
            # A sequence with much to catch up on (a prompt's last chunk, which comes with its
            # first draft request) gets no drafts this round: it is verified as a plain decode row
            # and caught up below, so that prompts never lengthen a drafting step.
            num_tokens = [0 if proposer.backlog(seq) > MAX_CATCH_UP else n for seq, n in zip(seqs, header["num_tokens"])]
            gens = [None if seq.params.greedy else seq.generator or self.default_gen for seq in seqs]
            drafts, dists = proposer.propose(seqs, num_tokens, gens, header.get("capacity"))
            # Sampled rows' distributions as drafted: compact ones travel as probabilities over
            # their support (a reduced vocabulary once, or each row's top-k / top-p survivors).
            sampled = [q for q in dists if q is not None]
            q = Dist.cat(sampled) if sampled else None
            tensors = [] if q is None else [q.probs] if q.ids is None else [q.probs, q.ids]
            # "free": whether its drafts cost nothing now (a lookup whose model is gated off), so
            # that the engine may score the lookup's drafts itself while it plays k = 0.
            answer = {"drafts": drafts, "vocab": None if q is None else q.vocab, "start": start, "end": time.time(),
                      "free": proposer.free_drafts([], 0) is not None}
            self.send(*self._prefilled(answer, tensors))
        # Once the drafts are out, while the target verifies: prompts' chunks, late sequences and
        # those a prompt lookup drafted (the model has not seen their newest tokens); then the
        # prompts handed over, for as long as the engine's last verification took.
        behind = {seq.seq_id: seq for seq in prefilled + seqs if proposer.backlog(seq) > 0}
        prefill(proposer, list(behind.values()))
        if self.target is not None and header.get("idle_s"):
            self.target.run(proposer, received + float(header["idle_s"]))
        return True

    def _prefilled(self, header: dict, tensors: list[torch.Tensor]) -> tuple[dict, list[torch.Tensor]]:
        """An answer with the prompts the target's copy has done since the last one: their ids and
        lengths, then their KV entries (keys, values, back to back) and last logits as 3 more tensors."""
        done = [] if self.target is None else self.target.take()
        if done:
            header["prefilled"] = [[p.seq_id, p.keys.shape[2]] for p in done]
            tensors = tensors + [torch.cat([p.keys for p in done], 2), torch.cat([p.values for p in done], 2),
                                 torch.cat([p.logits for p in done])]
        return header, tensors


def prefill(proposer: Proposer, seqs: list[Sequence]) -> None:
    if seqs:
        proposer.prefill(seqs, [len(seq) for seq in seqs])


def update_mirror(mirrors: dict[int, Sequence], item: list, proposer: Proposer, states) -> Sequence:
    """Append a message's news of one sequence (new tokens; the target's states of its newest
    positions for an EAGLE-3 head) to the drafter's mirror of it, made on first sight."""
    seq_id, new_tokens, params, gen_seed, state_span = item
    seq = mirrors.get(seq_id)
    if seq is None:
        gen = None if gen_seed is None else make_generator(gen_seed)
        seq = mirrors[seq_id] = Sequence(seq_id, "", 0, None, [], SamplingParams(**params), gen, None)
    seq.output_token_ids += new_tokens
    if state_span is not None:
        proposer.accept_states(seq, state_span[0], next(states))
    return seq


if __name__ == "__main__":
    worker_main(WorkerArgs(**json.loads(sys.argv[1])))
