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
