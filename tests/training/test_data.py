import torch

from minedraft.llm import LLM
from minedraft.training import data


def test_a_prompt_without_room_for_its_reply_is_left_out_of_its_shard(tiny_chat, tmp_path, monkeypatch):
    prompts = [("short", "Hello there."), ("long", "word " * 400), ("short", "Say something.")]
    monkeypatch.setattr(data, "build_prompts", lambda num, seed, mix, documents: prompts[:num])
    with LLM(str(tiny_chat), max_model_len=128, max_num_seqs=4) as llm:
        paths = data.generate_data(llm, tmp_path, 3, 3, max_tokens=8, top_k=2)
    samples = torch.load(paths[0])
    assert [s["category"] for s in samples] == ["short", "short"]
    assert all(0 < len(s["reply"]) <= 8 and len(s["prompt"]) + 8 <= 128 for s in samples)


def test_reply_shards_name_one_file_per_shard_of_prompts(tmp_path):
    assert data.reply_shards(tmp_path, 0, 128) == []
    assert [p.name for p in data.reply_shards(tmp_path, 256, 128)] == ["shard-0000.pt", "shard-0001.pt"]
    assert len(data.reply_shards(tmp_path, 257, 128)) == 3


class _Completion:
    def __init__(self, text: str, finish_reason: str):
        self.text, self.finish_reason = text, finish_reason


class _ScriptedLLM:
    """Answers chat requests with scripted texts and counts the calls."""

    def __init__(self, texts: list[tuple[str, str]]):
        self.texts, self.calls = texts, 0

    def chat(self, conversations, params, use_tqdm=True):
        self.calls += 1
        return [type("Out", (), {"outputs": [_Completion(*self.texts[i % len(self.texts)])]})()
                for i in range(len(conversations))]


def test_written_documents_keep_whole_articles_and_resume_from_their_shards(tmp_path, monkeypatch):
    requests = [{"kind": "news" if i % 2 == 0 else "encyclopedia", "subject": f"s{i}", "about": "thing",
                 "request": f"Write about s{i}."} for i in range(6)]
    monkeypatch.setattr(data, "document_requests", lambda num, seed: requests[:num])
    article = " ".join(f"Sentence number {i} says something new about the subject." for i in range(20))
    llm = _ScriptedLLM([(article, "stop"), (article + " And then it was cut", "length"), ("Too short.", "stop"),
                        ("It loops on and on here. " * 30, "stop")])
    documents = data.written_documents(llm, tmp_path, 6, shard_size=4)
    # Kept: the whole article and the cut one (ended at its last sentence); not the short or looping ones.
    assert [d["subject"] for d in documents] == ["s0", "s1", "s4", "s5"]
    assert documents[1]["text"] == article and documents[0]["request"] == "Write about s0."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["documents-0000.pt", "documents-0001.pt"]
    assert data.written_documents(llm, tmp_path, 6, shard_size=4) == documents and llm.calls == 2


def test_the_written_mix_has_the_target_write_its_documents_first(tiny_chat, tmp_path, monkeypatch):
    documents = [{"kind": "news", "subject": "Lyon", "about": "place", "text": "A museum opened in Lyon today."},
                 {"kind": "encyclopedia", "subject": "owl", "about": "thing", "text": "An owl is a bird of prey."}]
    calls = []
    monkeypatch.setattr(data, "written_documents",
                        lambda llm, folder, num, shard_size, seed: calls.append((folder, num)) or documents)
    with LLM(str(tiny_chat), max_model_len=256, max_num_seqs=4) as llm:
        paths = data.generate_data(llm, tmp_path / "data", 4, 4, max_tokens=4, top_k=2, mix="written")
    assert calls == [(tmp_path / "documents", 2)]  # half as many documents as prompts, beside the replies
    samples = torch.load(paths[0])
    assert len(samples) == 4 and {s["category"] for s in samples} <= {"summarization", "rag"}
