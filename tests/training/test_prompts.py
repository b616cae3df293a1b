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
