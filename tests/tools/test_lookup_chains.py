"""tools/exp_lookup_chains.py: prompt lookup's rounds replayed on greedy answers at a chain cap."""

from __future__ import annotations

import json

from tests.real_model import tool


def test_a_quoted_answer_needs_fewer_rounds_with_longer_chains(tmp_path, capsys):
    t = tool("exp_lookup_chains")
    quote = list(range(10, 30))  # 20 distinct tokens the answer copies
    prompt = [1, 2, *quote, 3]
    answer = [4, 10, 11, 12, *quote[3:], 5]  # after "10 11 12" the rest of the quote, then a new token
    # cap 4: the prefill gives 4; "3 4", "4 10" never occurred and "10 11" is a 2-gram:
    # plain steps emit 10, 11, 12; then "10 11 12" (n = 3) proposes four at a time, each
    # matched whole, plus the target's next token: 13-17, 18-22, 23-27; then 28 29 (and 3,
    # which misses: the target's 5)
    r4 = t.replay(prompt, answer, 4, 3)
    assert r4 == {"rounds": 7, "lookup_rounds": 4, "lookup_tokens": 5 + 5 + 5 + 3, "full": 3}
    # cap 16: 13-28 matched whole (+ 29), then "27 28 29" proposes 3: missed, the target's 5
    r16 = t.replay(prompt, answer, 16, 3)
    assert r16 == {"rounds": 5, "lookup_rounds": 2, "lookup_tokens": 17 + 1, "full": 1}
    assert r16["lookup_tokens"] == r4["lookup_tokens"] == len(answer) - 4  # the same tokens, fewer rounds
    # every token of the answer is emitted once, whatever the cap
    for cap in (1, 4, 16, 64):
        r = t.replay(prompt, answer, cap, 3)
        assert r["rounds"] - r["lookup_rounds"] + r["lookup_tokens"] == len(answer) - 1, cap
    # a match of 2 tokens is not taken with nmin 3
    assert t.replay([7, 8, 9], [1, 7, 8, 9], 4, 3)["lookup_rounds"] == 0
    assert t.replay([7, 8, 9], [1, 7, 8, 9], 4, 2)["lookup_rounds"] == 1
    stats = tmp_path / "s.json"
    stats.write_text(json.dumps({"prompts": [{"prompt_ids": prompt, "output_token_ids": answer}]}))
    assert t.main([str(stats), "--caps", "4,16"]) == 0
    out = capsys.readouterr().out
    assert f"cap   4: {r4['rounds']} rounds" in out and f"cap  16: {r16['rounds']} rounds" in out
