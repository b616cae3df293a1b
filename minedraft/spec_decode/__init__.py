"""Speculative decoding: the proposer protocol and its drafters (draft model, EAGLE-3 head, n-gram,
and any of them in a process of its own), the rejection sampler, the draft-length controller,
TETRIS selection and the counters. `make_proposer` builds what a configuration asks for."""

import torch

from minedraft.config import EngineConfig
from minedraft.models.eagle3 import Eagle3Args, load_eagle3
from minedraft.models.llama import Decoder
from minedraft.models.loader import load_model, read_config
from minedraft.spec_decode.base import Proposer
from minedraft.spec_decode.draft_model import DraftModelProposer
from minedraft.spec_decode.eagle3 import Eagle3Proposer
from minedraft.spec_decode.ngram import LookupFirst, NgramProposer
from minedraft.spec_decode.remote import RemoteDrafter, WorkerArgs, free_port, pin


def make_proposer(config: EngineConfig, target: Decoder) -> Proposer:
    """The proposer `config.speculative` describes, for `target` (already loaded). A drafter in its
    own process is started here, and this process pinned to the target's cores; raises DrafterError
    when it fails to start."""
    c, spec = config, config.speculative
    lookup = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max, target.args.vocab_size, c.torch_dtype)
    if spec.method == "ngram":
        return lookup
    if spec.remote:
        pin(tuple(spec.target_cpus) if spec.target_cpus else None)
        address = spec.rendezvous or f"tcp://127.0.0.1:{free_port()}"
        sizes = [spec.prompt_lookup_min, spec.prompt_lookup_max] if spec.prompt_lookup_first else None
        args = WorkerArgs(str(spec.model_path), str(c.model_path), c.dtype, spec.draft_device, c.num_slots,
                          c.max_model_len, spec.draft_cpus, address, c.seed + 1, list(c.compile_sizes),
                          not c.enforce_eager, sizes, spec.prefill_on_drafter)
        aux_layers = ()
        if spec.method == "eagle3":
            aux_layers = Eagle3Args.from_hf(read_config(spec.model_path)).aux_layers(target.args.num_layers)
        # The drafter process puts the lookup first; the engine keeps the same one for `free_drafts`.
        return RemoteDrafter(args, spec.draft_timeout_s, aux_layers, lookup if spec.prompt_lookup_first else None)
    model = model_proposer(c, target)
    return LookupFirst(model, lookup) if spec.prompt_lookup_first else model


def model_proposer(config: EngineConfig, target: Decoder) -> Proposer:
    """The draft model or EAGLE-3 head of `config.speculative`, in this process."""
    c, spec, device = config, config.speculative, torch.device(config.device)
    if spec.method == "eagle3":
        head = load_eagle3(spec.model_path, c.torch_dtype, device, target.input_embedding,
                           compiled=bool(c.compile_sizes))
        return Eagle3Proposer(head, target.args.num_layers, c.num_slots, c.max_model_len, c.torch_dtype, device,
                              c.compile_sizes, not c.enforce_eager)
    draft = target if spec.model == "self" else load_model(spec.model_path, c.torch_dtype, device,
                                                           embedding=target.input_embedding,
                                                           compiled=bool(c.compile_sizes))
    return DraftModelProposer(draft, c.num_slots, c.max_model_len, c.torch_dtype, device, c.compile_sizes,
                              not c.enforce_eager)


__all__ = ["DraftModelProposer", "Eagle3Proposer", "LookupFirst", "NgramProposer", "Proposer", "RemoteDrafter", "make_proposer"]
