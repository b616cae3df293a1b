from minedraft.spec_decode.tetris import select_lengths


def test_the_most_probable_prefixes_across_rows_are_kept():
    # Prefix probabilities: row 0: 0.9, 0.81, 0.405; row 1: 0.5, 0.45; row 2: 0.95, 0.095.
    rows = [[0.9, 0.9, 0.5], [0.5, 0.9], [0.95, 0.1]]
    assert select_lengths(rows, 0) == [0, 0, 0]
    assert select_lengths(rows, 3) == [2, 0, 1]  # 0.95, 0.9, 0.81
    assert select_lengths(rows, 5) == [2, 2, 1]  # then 0.5, 0.45
    assert select_lengths(rows, 6) == [3, 2, 1]  # then 0.405
    assert select_lengths(rows, 100) == [3, 2, 2]


def test_the_kept_drafts_of_a_row_are_a_prefix_even_with_ties_and_zero_probabilities():
    rows = [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.5, 1.0, 1.0]]
    expected = {2: [1, 1, 0], 4: [3, 1, 0], 7: [3, 1, 3], 9: [3, 3, 3]}
    for capacity in range(10):
        keep = select_lengths(rows, capacity)
        assert sum(keep) == capacity  # one kept draft per selected prefix: the selection is prefix-closed
        assert keep == expected.get(capacity, keep)
