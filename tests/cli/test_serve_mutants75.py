"""specrt serve: request parsing and response building a mutation round of specrt/cmd_serve.py
found unpinned (session 75, m75e: each test fails on its mutant, passes on the code)."""
from __future__ import annotations

from tests.cli.test_serve import _post, served  # noqa: F401
from tests.runtime.test_text import bytewise, worded  # noqa: F401


def test_an_empty_string_prompt_is_refused_as_an_empty_list_is(served):  # noqa: F811
    """Mutant m75e-15 (``_prompts`` taking "" as a prompt): ``prompt: ""`` (alone or among
    several) holds no text: the 400 that names 'prompt' and asks for a non-empty string."""
    url, _ = served
    for prompt in ("", ["w1 w2", ""]):
        code, r = _post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert code == 400 and r["error"]["param"] == "prompt", (prompt, r)
        assert "non-empty string" in r["error"]["message"], r


def test_every_streamed_chat_chunk_with_logprobs_carries_a_logprobs_object(served):  # noqa: F811
    """Mutants m75e-22 (``_chat_logprobs`` answering null for no entries) and m75e-106 (the role
    chunk's entries None passed through to it, not as []): with ``logprobs`` true, every chunk
    of a chat stream, the role's first chunk and the finish's too, carries {content: [...],
    refusal: null}, as the whole answer does, so that a client reading
    ``choices[0].logprobs.content`` of each chunk finds a list."""
    url, _ = served
    code, ev = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1 w4"}], "max_tokens": 3,
                                                   "logprobs": True, "stream": True})
    assert code == 200, ev
    lps = [e["choices"][0]["logprobs"] for e in ev]
    assert all(lp is not None and isinstance(lp["content"], list) and lp["refusal"] is None for lp in lps), lps
    assert lps[0]["content"] == [] and sum(len(lp["content"]) for lp in lps) >= 1, lps




def test_echo_gives_a_text_prompt_back_as_it_was_sent(served):  # noqa: F811
    """Mutant m75e-80 (echo giving a text prompt back as its tokens decode): with ``echo`` a
    completion's text starts with the prompt exactly as the client sent it (spaces doubled, at
    its start, a newline), as OpenAI echoes it, streamed and not; a prompt of token ids is
    echoed as their text."""
    url, _ = served
    for prompt in ("w4  w2", " w4 w2", "w4 w2\n"):
        code, r = _post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "echo": True})
        assert code == 200 and r["choices"][0]["text"].startswith(prompt), (prompt, r)
        assert r["choices"][0]["text"] != prompt  # (and its completion after it)
        code, ev = _post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0,
                                                  "stream": True})
        assert code == 200 and "".join(c["text"] for e in ev for c in e["choices"]) == prompt, (prompt, ev)
    code, r = _post(url, "/v1/completions", {"prompt": [4, 2], "max_tokens": 0, "echo": True, "logprobs": 0})
    assert code == 200 and r["choices"][0]["text"] == "w4 w2", r


def test_a_request_left_in_a_later_choice_counts_its_prompt_once(worded):  # noqa: F811
    """Mutant m75e-89 (every choice taken for its prompt's first): a request of n 2 whose client
    leaves during the second choice counts its prompt once in its log line and in /metrics'
    prompt tokens, as usage counts it (the second choice reuses the first's rows: its prompt was
    counted with the first choice)."""
    import re

    from specrt.cmd_serve import Server
    from specrt.runtime.sampling import SamplingParams

    logs: list[str] = []
    app = Server(worded, "fixed:1", SamplingParams(), 8, "tiny", log=logs.append)
    try:
        body = {"prompt": "w1 w2", "max_tokens": 6, "n": 2}
        prompt = list(app.complete(app.parse(body, False)))[-1]["usage"]["prompt_tokens"]
        assert prompt == 2
        before = app.metrics.counts["prompt_tokens"]
        pieces = app.complete(app.parse(body, False))
        for piece in pieces:
            if piece.get("index") == 1 and "text" in piece:
                break
        else:
            raise AssertionError("the second choice wrote no text")
        pieces.close()  # (the client left)
        assert "finish none: the client left" in logs[-1] and re.match(rf"\[{prompt} prompt tokens \(", logs[-1]), logs
        assert app.metrics.counts["prompt_tokens"] - before == prompt
    finally:
        app.close()


def test_a_waiter_that_waited_again_behind_a_later_one_still_gets_its_turn():
    """Mutant m75e-41 (TurnLock.release waking one waiter, not all): a waiter that woke early
    (the notify_all of a waiter interrupted before it, or a spurious wakeup, which
    Condition allows) waits again behind one that asked later; at the release the one woken
    must be the first in line, so every waiter is woken, and each takes the lock in its turn
    (with one woken, the later one woke, found itself second and waited again: no one took it)."""
    import threading
    import time

    from specrt.cmd_serve import TurnLock

    lock, order = TurnLock(), []
    lock.acquire()
    real = lock.cond.wait
    early = threading.Event()

    def wait(timeout=None):
        if threading.current_thread() is first and not early.is_set():
            early.set()
            return real(0.3)  # (woken early: the later one is in line and waiting by then)
        return real(timeout)

    lock.cond.wait = wait

    def take(name):
        with lock:
            order.append(name)

    first, later = (threading.Thread(target=take, args=(n,), daemon=True) for n in ("first", "later"))
    for t, n in ((first, 2), (later, 3)):  # in line in that order (the holder's ticket first)
        t.start()
        for _ in range(1000):
            if len(lock.queue) == n:
                break
            time.sleep(0.01)
        assert len(lock.queue) == n, lock.queue
    time.sleep(0.6)  # (the first has woken and waits again, behind the later one)
    lock.release()
    first.join(timeout=10)
    later.join(timeout=10)
    assert order == ["first", "later"], order


def test_echo_with_max_tokens_0_and_no_logprobs_answers_the_prompt(served):  # noqa: F811
    """m75e's F1: the README has echo take max_tokens 0; without logprobs it was a 400 naming
    'prompt' in the runtime's words ("max_new_tokens=0: expected >= 1"). It answers the prompt
    alone, no logprobs, finish "length", 0 completion tokens (vLLM's)."""
    url, _ = served
    for stream in (False, True):
        code, r = _post(url, "/v1/completions", {"prompt": "w4 w2", "max_tokens": 0, "echo": True,
                                                 "stream": stream})
        assert code == 200, r
        if stream:
            text = "".join(c["text"] for e in r for c in e["choices"])
            assert text == "w4 w2" and all(c.get("logprobs") is None for e in r for c in e["choices"])
        else:
            ch = r["choices"][0]
            assert ch["text"] == "w4 w2" and ch["logprobs"] is None and ch["finish_reason"] == "length"
            assert r["usage"]["completion_tokens"] == 0


def test_echoed_text_offsets_point_into_the_text_as_sent(served):  # noqa: F811
    """m75e's F2: with echo and logprobs, text_offset counted through the prompt's tokens'
    decoding, which is not the prompt as sent where it had two spaces or a leading one: the
    offsets from its second token on were one character out. Each token's text now starts at
    its offset in the answer's text, the prompt's and the completion's."""
    url, _ = served
    for prompt in ("w4  w2", " w4 w2", "w4 w2"):
        code, r = _post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "echo": True, "logprobs": 0})
        assert code == 200, r
        ch = r["choices"][0]
        assert ch["text"].startswith(prompt)
        lp = ch["logprobs"]
        assert lp["tokens"] == ["w4", "w2", "w5", "w1"]  # (the word-level tokenizer's words)
        for tok, at in zip(lp["tokens"], lp["text_offset"]):  # (before: [0, 3, 6, 9] for all three)
            assert ch["text"][at:at + len(tok)] == tok, (prompt, tok, at, ch["text"])


def test_echo_with_max_tokens_0_and_no_logprobs_takes_a_prompt_of_the_whole_context(bytewise):  # noqa: F811
    """A review (r75l) of m75e's F1 mend: with a tokenizer whose prompts are bounded before they
    are tokenized (byte-level BPE, ``Text.least_tokens``), echo with max_tokens 0 and no logprobs
    still said "max_new_tokens=0: expected >= 1" of a prompt of the whole context (128 tokens,
    answered with logprobs 0) and of one past it. The prompt of 128 is answered, the one of 129
    refused for the context, as with logprobs."""
    from tests.cli.test_serve_tokenize import _server

    with _server(bytewise) as (_, url):
        for lp in ({}, {"logprobs": 0}):
            code, r = _post(url, "/v1/completions", {"prompt": " xylophone" * 128, "max_tokens": 0, "echo": True,
                                                     **lp})
            assert code == 200 and r["usage"]["prompt_tokens"] == 128, (lp, r)
            assert r["choices"][0]["text"] == " xylophone" * 128
            code, r = _post(url, "/v1/completions", {"prompt": " xylophone" * 129, "max_tokens": 0, "echo": True,
                                                     **lp})
            assert code == 400 and "context limit is 128" in r["error"]["message"], (lp, r)


def test_echo_with_max_tokens_0_and_no_logprobs_runs_nothing(worded):  # noqa: F811
    """NOTES s75: echo: with max_tokens 0 and no logprobs the answer is the prompt's own text,
    yet a scoring prefill ran for it, its entries not sent (a request of a 128-token prompt took
    4.4-5.7 ms on the tiny engines, 1.2-1.3 ms without). Nothing runs now (the session's last
    stream is still the request's before), and the answers, their usage, the log line and
    /metrics' prompt tokens are as they were, for text and ids prompts, two of them with n 2,
    and for a client that leaves at its echo (its prompt counted, as a stream's is)."""
    from specrt.cmd_serve import Server
    from specrt.runtime.sampling import SamplingParams

    logs: list[str] = []
    app = Server(worded, "fixed:1", SamplingParams(), 8, "tiny", log=logs.append)
    try:
        list(app.complete(app.parse({"prompt": "w1 w2", "max_tokens": 3}, False)))
        assert app.session.stats()["prompt_ids"] == [1, 2]
        before = app.metrics.counts["prompt_tokens"]
        out = list(app.complete(app.parse({"prompt": [[4, 2, 5], "w3"], "n": 2, "max_tokens": 0, "echo": True},
                                          False)))
        assert app.session.stats()["prompt_ids"] == [1, 2]  # (the request before's: nothing ran)
        assert [(o["index"], o["text"]) for o in out if "text" in o] == [(0, "w4 w2 w5"), (1, "w4 w2 w5"),
                                                                         (2, "w3"), (3, "w3")]
        assert [o["finish_reason"] for o in out if "finish_reason" in o] == ["length"] * 4
        assert out[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 4}
        assert logs[-1].startswith("[4 prompt tokens (0 reused), 0 new in 4 choices in "), logs
        assert app.metrics.counts["prompt_tokens"] - before == 4
        pieces = app.complete(app.parse({"prompt": "w4 w2 w5", "max_tokens": 0, "echo": True}, False))
        assert next(pieces)["text"] == "w4 w2 w5"
        pieces.close()  # (the client left)
        assert logs[-1].startswith("[3 prompt tokens (0 reused), 0 new in ") and "the client left" in logs[-1], logs
        assert app.metrics.counts["prompt_tokens"] - before == 7 and app.session.stats()["prompt_ids"] == [1, 2]
    finally:
        app.close()
