"""End to end on the bundled SmolLM2-135M-Instruct."""

from minedraft import SamplingParams

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_answers_paris(smollm2):
    out = smollm2.chat(CAPITAL, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert "Paris" in out[0].outputs[0].text
    assert out[0].outputs[0].finish_reason == "stop"


def test_chat_takes_a_list_of_conversations(smollm2):
    other = [{"role": "user", "content": "What is 2 + 2?"}]
    outs = smollm2.chat([CAPITAL, other], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert len(outs) == 2 and "Paris" in outs[0].outputs[0].text and "4" in outs[1].outputs[0].text


def test_incremental_text_equals_full_decode(smollm2):
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=40, ignore_eos=True)
    out = smollm2.generate(["Café au lait, naïve résumé — 東京 🚀"], params, use_tqdm=False)[0].outputs[0]
    assert out.text == smollm2.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_stop_string_truncates_text(smollm2):
    free = smollm2.chat(CAPITAL, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0]
    out = smollm2.chat(CAPITAL, SamplingParams(temperature=0, max_tokens=16, stop=["Paris"]), use_tqdm=False)
    out = out[0].outputs[0]
    assert out.text == free.text[: free.text.index("Paris")] and out.finish_reason == "stop"
