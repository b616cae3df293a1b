"""The checkpoint format of a drafter made for one target (`minedraft train-draft`): a Hugging Face
Llama folder whose config.json carries a `minedraft_draft` block, whose head scores only the tokens
listed in its `draft_vocab` tensor, and which stores no input embedding (it reads its target's).

The decoder's config parsing, the drafter process, the trainer and the transformers peer in the
benchmark all read or write this format through here.
"""

import torch

CONFIG_KEY = "minedraft_draft"
VOCAB_TENSOR = "draft_vocab"


def is_draft_checkpoint(config: dict) -> bool:
    return CONFIG_KEY in config


def draft_vocab_size(config: dict) -> int | None:
    """How many tokens the drafter's head scores; None for an ordinary checkpoint (all of them)."""
    return (config.get(CONFIG_KEY) or {}).get("draft_vocab_size")


def uses_target_embedding(config: dict) -> bool:
    """Whether the checkpoint leaves out its input embedding and reads its target's instead."""
    return (config.get(CONFIG_KEY) or {}).get("embedding") == "target"


def draft_vocab(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The token ids the head scores, in head-row order."""
    return tensors[VOCAB_TENSOR].long()


def draft_checkpoint(target_config: dict, num_layers: int, layers_and_head: dict[str, torch.Tensor],
                     vocab_ids: torch.Tensor, extra: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """The config.json and tensors of a drafter with the target's shape but `num_layers` layers:
    `layers_and_head` in Hugging Face names, without the embedding; `extra` goes into the block."""
    config = {**target_config, "num_hidden_layers": num_layers, "tie_word_embeddings": False,
              CONFIG_KEY: {"draft_vocab_size": len(vocab_ids), "embedding": "target", **extra}}
    return config, {**layers_and_head, VOCAB_TENSOR: vocab_ids.clone()}


def full_vocabulary(config: dict, tensors: dict[str, torch.Tensor], embedding: torch.Tensor,
                    dtype: torch.dtype) -> tuple[dict, dict[str, torch.Tensor]]:
    """An ordinary Llama checkpoint (config without the block, tensors) that computes what the
    drafter does: the target's `embedding` put back, and each head row moved to its token's row of
    a full-vocabulary head whose other rows are zero."""
    plain = {k: v for k, v in config.items() if k != CONFIG_KEY}
    out = {k: v for k, v in tensors.items() if k != VOCAB_TENSOR}
    out["model.embed_tokens.weight"] = embedding
    head = torch.zeros(config["vocab_size"], config["hidden_size"], dtype=dtype)
    head[draft_vocab(tensors)] = tensors["lm_head.weight"].to(dtype)
    out["lm_head.weight"] = head
    return plain, out
