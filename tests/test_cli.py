import pytest

from minedraft.cli import main


def test_generate_prints_the_completion(smollm2_path, capsys):
    main(["generate", "--model", str(smollm2_path), "--chat", "--prompt", "What is the capital of France?",
          "--max-tokens", "12", "--speculative-config", '{"model": "self", "num_speculative_tokens": 2}', "--stats"])
    out, err = capsys.readouterr()
    assert "Paris" in out and "acceptance_rate: 1.0" in err


@pytest.mark.parametrize("argv,message", [
    (["--max-tokens", "0"], "max_tokens"),
    (["--speculative-config", "{bad"], "not valid JSON"),
    (["--model", "/no/such/model"], "does not exist"),
])
def test_bad_arguments_exit_2_with_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "hi", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
