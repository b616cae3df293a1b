from minedraft.engine.sequence import CompletionOutput, RequestOutput, time_per_output_token


def test_latencies_use_the_longest_completion_and_vllms_tpot():
    outputs = [CompletionOutput(0, "", [1, 2, 3], "stop", None), CompletionOutput(1, "", [4], "stop", None)]
    done = RequestOutput("r", None, [9], outputs, True, arrival_time=10.0, first_token_time=11.0, finish_time=13.0)
    assert done.latencies() == (1.0, 1.0, 3.0)  # TPOT: 2 s after the first token over 2 more tokens
    running = RequestOutput("r", None, [9], outputs, False, 10.0, 11.0, None)
    assert running.latencies() is None
    assert time_per_output_token(3.0, 1.0, 1) is None
