import torch

from minedraft.models.draft_format import (
    draft_checkpoint, draft_vocab, draft_vocab_size, full_vocabulary, is_draft_checkpoint, uses_target_embedding,
)
from minedraft.models.hf_format import ModelArgs
from minedraft.models.loader import read_config, read_safetensors


def test_written_draft_reads_back(tiny_llama):
    target = read_config(tiny_llama)
    ids = torch.tensor([1, 5, 7])
    config, tensors = draft_checkpoint(target, 1, {"lm_head.weight": torch.ones(3, 4)}, ids, {"note": 1})
    assert is_draft_checkpoint(config) and uses_target_embedding(config) and draft_vocab_size(config) == 3
    assert torch.equal(draft_vocab(tensors), ids)
    args = ModelArgs.from_hf(config)
    assert (args.num_layers, args.draft_vocab_size, args.shared_embedding) == (1, 3, True)
    assert not is_draft_checkpoint(target) and draft_vocab_size(target) is None and not uses_target_embedding(target)


def test_full_vocabulary_puts_head_rows_at_their_tokens(tiny_distilled, tiny_llama):
    config, tensors = read_config(tiny_distilled), read_safetensors(tiny_distilled)
    embedding = read_safetensors(tiny_llama)["model.embed_tokens.weight"]
    plain, full = full_vocabulary(config, tensors, embedding, torch.float64)
    assert not is_draft_checkpoint(plain) and "draft_vocab" not in full
    assert full["model.embed_tokens.weight"] is embedding
    ids, head = draft_vocab(tensors), full["lm_head.weight"]
    assert head.shape[0] == config["vocab_size"]
    assert torch.equal(head[ids], tensors["lm_head.weight"].double())
    others = torch.ones(config["vocab_size"], dtype=torch.bool).index_fill_(0, ids, False)
    assert not head[others].any()
