from minedraft.spec_decode.exploration import Exploration


def test_tries_double_apart_while_the_best_holds_and_start_over_when_it_moves_or_looks_promising():
    e = Exploration(every=4, max_interval=16)
    due = [r for r in range(1, 60) if e.due(r, best="a")]
    assert due == [4, 8, 16, 32, 48]  # 4, 4 (the first try has nothing to compare with), 8, 16, 16
    assert e.due(64, best="b") and e.next == 68  # the best moved: soon again
    e.soon(66)  # not due yet, and already as soon as it gets
    assert e.next == 68
    assert e.due(68, best="b") and e.next == 76
    e.soon(69)
    assert e.next == 73 and e.interval == 4
