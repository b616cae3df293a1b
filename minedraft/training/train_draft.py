"""`minedraft train-draft`: make a drafter for a target, resumably, in three stages — data (the
target's replies to the training prompts, and its predictions along documentation text, in
shards), distillation (checkpoints), export (a checkpoint folder)."""

import argparse
import json
import logging
from pathlib import Path

import torch

from minedraft.models.loader import eos_token_ids, load_model, load_tokenizer, resolve_model
from minedraft.training.data import forced_data, generate_data, reply_shards
from minedraft.training.distill import TrainConfig, frequent_tokens, split, train
from minedraft.training.eagle3 import (Eagle3TrainConfig, Trainer, feature_shards, head_aux_layers, head_vocabulary,
                                       load_features,
                                       plot_curve)


def run(args: argparse.Namespace) -> Path:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.method == "eagle3":
        return run_eagle3(args)
    work = Path(args.out)
    target = resolve_model(args.model)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    from minedraft.llm import LLM

    with LLM(args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
             num_threads=args.num_threads) as llm:
        shards = generate_data(llm, work / "data", args.num_prompts, args.shard_size, args.max_tokens,
                               args.top_k, args.seed, args.prompt_mix)
        shards += forced_data(llm, work / "data", args.num_texts, args.shard_size, args.top_k, seed=args.seed)
    config = TrainConfig(init_layers=tuple(int(i) for i in args.init_layers.split(",")), init_from=args.init_from,
                         vocab_size=args.vocab_size, epochs=args.epochs, batch_tokens=args.batch_tokens, lr=args.lr,
                         autocast_bf16=args.autocast_bf16, seed=args.seed)
    student = train(target, shards, work / "train", config, eos_token_ids(target, load_tokenizer(target)))
    recipe = {k: v for k, v in vars(args).items() if k != "func"}
    out = student.export(Path(args.export) if args.export else work / "model", {"recipe": recipe})
    plot_log(work / "train" / "log.jsonl", work / "agreement.png")
    print(f"wrote the drafter to {out} and its training curve to {work / 'agreement.png'}")
    return out


def plot_log(log_path: Path, png: Path) -> None:
    """Held-out top-1 agreement with the target and loss against training time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in log_path.read_text().splitlines()]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    minutes = [r["time_s"] / 60 for r in rows]
    for kind in ("greedy", "sampled", "forced"):
        if f"{kind}_agreement" in rows[0]:
            ax1.plot(minutes, [r[f"{kind}_agreement"] for r in rows], marker="o", label=f"{kind} replies")
            ax2.plot(minutes, [r[f"{kind}_loss"] for r in rows], marker="o", label=f"{kind} replies")
    ax1.set(xlabel="training minutes", ylabel="held-out top-1 agreement with the target")
    ax2.set(xlabel="training minutes", ylabel="held-out cross-entropy to the target (nats)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def run_eagle3(args: argparse.Namespace) -> Path:
    """Replies (resumable shards; every shard already in OUT/data is used too), target features per
    shard, then training from the last checkpoint; the head is exported whenever its held-out
    acceptance improves."""
    work = Path(args.out)
    target_path = resolve_model(args.model)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    # The engine only when replies are missing: its KV cache and graphs would stay in the process
    # (freed memory is not given back) beside the training's.
    if any(not p.exists() for p in reply_shards(work / "data", args.num_prompts, args.shard_size)):
        from minedraft.llm import LLM

        with LLM(args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                 num_threads=args.num_threads) as llm:
            generate_data(llm, work / "data", args.num_prompts, args.shard_size, args.max_tokens, args.top_k, args.seed,
                          args.prompt_mix)
    shards = sorted((work / "data").glob("shard-*.pt"))
    if not shards:
        raise ValueError(f"no reply shards in {work / 'data'}: give --num-prompts")
    target = load_model(target_path, torch.float32, torch.device("cpu"))
    init_from = Path(args.init_from) if args.init_from else None
    # A warm start keeps the head's auxiliary layers (its shape depends on them).
    aux_layers = head_aux_layers(init_from, target.args.num_layers)
    paths = feature_shards(target, shards, work / "features", aux_layers, args.max_model_len)
    samples = load_features(paths)
    train_set, held_out = split(samples)
    vocab_file = work / "draft_vocab.pt"  # fixed at the first run: the head's shape depends on it
    # A warm start keeps the head's vocabulary, unless --vocab-size asks for another size: then the
    # most frequent reply tokens again, the exported head's rows kept for those it holds.
    if not vocab_file.exists() and init_from is not None:
        head_ids = head_vocabulary(init_from)
        if len(head_ids) == args.vocab_size:
            torch.save(head_ids, vocab_file)
    if not vocab_file.exists():
        eos = eos_token_ids(target_path, load_tokenizer(target_path))
        ids, coverage = frequent_tokens(train_set, target.args.vocab_size, args.vocab_size, eos)
        torch.save(ids, vocab_file)
        logging.info("draft vocabulary: %d tokens cover %.1f%% of reply tokens", len(ids), 100 * coverage)
    config = Eagle3TrainConfig(ttt_steps=args.ttt_steps, prompt_loss_weight=args.prompt_loss_weight, epochs=args.epochs,
                               batch_tokens=args.batch_tokens, lr=args.lr, autocast_bf16=args.autocast_bf16,
                               seed=args.seed)
    trainer = Trainer(target, work, config, aux_layers, torch.load(vocab_file), init_from)
    export = Path(args.export) if args.export else work / "model"
    logging.info("training on %d replies (%d held out)", len(train_set), len(held_out))
    trainer.train(train_set, held_out, export, args.max_minutes)
    plot_curve(work / "log.jsonl", work / "acceptance.png")
    print(f"best head (held-out mean acceptance length {trainer.best:.3f}) in {export}; curve in {work / 'log.jsonl'}")
    return export
