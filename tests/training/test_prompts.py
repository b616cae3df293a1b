import pytest

from minedraft.training.prompts import build_prompts, math_problem


def test_prompts_are_reproducible_and_a_longer_list_extends_a_shorter_one():
    short, long = build_prompts(30, seed=4), build_prompts(60, seed=4)
    assert long[:30] == short
    assert build_prompts(30, seed=5) != short
    assert all(text.strip() for _, text in long)


def test_prompts_cover_every_kind_of_request():
    kinds = {kind for kind, _ in build_prompts(300)}
    assert {"writing", "question", "math", "code"} <= kinds


def test_math_problems_carry_their_numbers():
    import random

    text = math_problem(random.Random(1))
    assert any(ch.isdigit() for ch in text) and text.endswith(("?", "steps."))


def test_the_spec_bench_mix_adds_its_task_shapes_and_keeps_the_original_families():
    short, long = build_prompts(40, seed=2, mix="spec_bench"), build_prompts(400, seed=2, mix="spec_bench")
    assert long[:40] == short
    kinds = {kind for kind, _ in long}
    assert {"writing", "question", "math_reasoning"} <= kinds  # the rest need local text (apt packages)
    for kind, text in long:
        if kind == "translation_de":
            assert text.startswith("Translate German to English: ")
        if kind == "summarization":
            assert text.startswith("Summarize: ") and len(text) > 1000
    assert build_prompts(40, seed=2) != short


def test_fortune_entries_are_prose_without_attribution(tmp_path):
    from minedraft.training.prompts import fortunes

    (tmp_path / "sprueche").write_text("Erste Zeile eines Spruchs,\nzweite Zeile.\n\t\t-- Jemand\n%\n<nick> hallo welt "
                                       "wie geht es\n%\n|_|_| |_|\n%\n")
    assert fortunes(tmp_path) == ["Erste Zeile eines Spruchs, zweite Zeile."]


def test_document_requests_alternate_news_and_encyclopedia_articles_reproducibly():
    from minedraft.training.prompts import document_requests, wordnet_terms

    if not wordnet_terms()["place"]:
        pytest.skip("needs WordNet (apt-get install wordnet-base)")
    short, long = document_requests(10, seed=1), document_requests(20, seed=1)
    assert long[:10] == short and document_requests(10, seed=2) != short
    assert [r["kind"] for r in short] == ["news", "encyclopedia"] * 5
    for r in long:
        assert r["about"] in ("person", "place", "thing") and r["subject"] in r["request"]


def test_a_looping_text_is_repetitive():
    from minedraft.training.prompts import is_repetitive

    assert is_repetitive("The river is long and wide. It flows east. The river is long and wide. The end.")
    assert not is_repetitive("The river is long and wide. It flows east to the sea. Fish live in it.")
    assert not is_repetitive("Yes. Yes. Yes.")  # short sentences repeat in real prose


def test_the_written_mix_summarises_news_and_answers_from_encyclopedia_articles():
    documents = [{"kind": "news", "subject": "Lyon", "about": "place", "text": "A museum opened in Lyon.\n\nIt is big."},
                 {"kind": "encyclopedia", "subject": "Newton", "about": "person", "text": "Newton was a physicist."},
                 {"kind": "encyclopedia", "subject": "owl", "about": "thing", "text": "An owl is a bird."}]
    prompts = build_prompts(60, seed=3, mix="written", documents=documents)
    assert prompts == build_prompts(60, seed=3, mix="written", documents=documents)
    assert {kind for kind, _ in prompts} == {"summarization", "rag"}
    for kind, text in prompts:
        if kind == "summarization":
            assert text == "Summarize: A museum opened in Lyon. It is big."
        else:
            context, question = text.rsplit("\n", 1)
            subject = "Newton" if context.startswith("Newton") else "owl"
            assert subject in question and context.startswith(("Newton was", "An owl is"))
    with pytest.raises(ValueError, match="news and encyclopedia"):
        build_prompts(4, mix="written", documents=documents[1:])


def test_the_written_mix_puts_each_encyclopedia_article_in_a_context_once():
    documents = [{"kind": "news", "subject": "Lyon", "about": "place", "text": "A museum opened in Lyon."},
                 {"kind": "encyclopedia", "subject": "Newton", "about": "person", "text": "Newton was a physicist."}]
    for kind, text in build_prompts(40, seed=1, mix="written", documents=documents):
        if kind == "rag":  # one encyclopedia article only: it cannot be sampled again as an extra one
            assert text.count("Newton was a physicist.") == 1
