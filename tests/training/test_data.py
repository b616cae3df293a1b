import torch

from minedraft.llm import LLM
from minedraft.training import data


def test_a_prompt_without_room_for_its_reply_is_left_out_of_its_shard(tiny_chat, tmp_path, monkeypatch):
    prompts = [("short", "Hello there."), ("long", "word " * 400), ("short", "Say something.")]
    monkeypatch.setattr(data, "build_prompts", lambda num, seed, mix: prompts[:num])
    with LLM(str(tiny_chat), max_model_len=128, max_num_seqs=4) as llm:
        paths = data.generate_data(llm, tmp_path, 3, 3, max_tokens=8, top_k=2)
    samples = torch.load(paths[0])
    assert [s["category"] for s in samples] == ["short", "short"]
    assert all(0 < len(s["reply"]) <= 8 and len(s["prompt"]) + 8 <= 128 for s in samples)


def test_reply_shards_name_one_file_per_shard_of_prompts(tmp_path):
    assert data.reply_shards(tmp_path, 0, 128) == []
    assert [p.name for p in data.reply_shards(tmp_path, 256, 128)] == ["shard-0000.pt", "shard-0001.pt"]
    assert len(data.reply_shards(tmp_path, 257, 128)) == 3
