"""`minedraft train-draft`: make a drafter for a target, resumably, in three stages — data (the
target's replies to the training prompts, and its predictions along documentation text, in
shards), distillation (checkpoints), export (a checkpoint folder)."""

import argparse
import logging
from pathlib import Path

import torch

from minedraft.models.loader import eos_token_ids, load_tokenizer, resolve_model
from minedraft.training.data import forced_data, generate_data
from minedraft.training.distill import TrainConfig, train


def run(args: argparse.Namespace) -> Path:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(args.out)
    target = resolve_model(args.model)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    from minedraft.llm import LLM

    with LLM(args.model, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
             num_threads=args.num_threads) as llm:
        shards = generate_data(llm, work / "data", args.num_prompts, args.shard_size, args.max_tokens,
                               args.top_k, args.seed)
        shards += forced_data(llm, work / "data", args.num_texts, args.shard_size, args.top_k, seed=args.seed)
    config = TrainConfig(init_layers=tuple(int(i) for i in args.init_layers.split(",")), vocab_size=args.vocab_size,
                         epochs=args.epochs, batch_tokens=args.batch_tokens, lr=args.lr, seed=args.seed)
    student = train(target, shards, work / "train", config, eos_token_ids(target, load_tokenizer(target)))
    recipe = {k: v for k, v in vars(args).items() if k != "func"}
    out = student.export(Path(args.export) if args.export else work / "model", {"recipe": recipe})
    print(f"wrote the drafter to {out}")
    return out
