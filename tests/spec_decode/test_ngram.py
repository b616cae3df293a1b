from minedraft.spec_decode.ngram import lookup


def test_lookup_takes_the_longest_suffix_and_its_latest_occurrence():
    tokens = [1, 2, 3, 9, 2, 3, 8, 7, 1, 2, 3]
    # "1 2 3" occurred at 0 (followed by 9 2); "2 3" alone also at 4 (followed by 8): longest wins.
    assert lookup(tokens, 1, 3, 2) == [9, 2]
    assert lookup(tokens, 1, 2, 2) == [8, 7]  # "2 3": the latest earlier occurrence
    assert lookup(tokens, 1, 3, 10) == [9, 2, 3, 8, 7, 1, 2, 3]  # stops at the end of the sequence


def test_lookup_without_a_match_proposes_nothing():
    assert lookup([1, 2, 3, 4], 1, 3, 4) == []
    assert lookup([5], 1, 3, 4) == []
    assert lookup([4, 6, 4], 2, 3, 4) == []  # only a 1-gram repeats, below min_n
