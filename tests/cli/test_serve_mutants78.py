"""Mutation round m78i over session 78's new serve code: specrt/responses.py's Store, context,
stored (GET / DELETE /v1/responses/{id}, .../input_items), cmd_serve.py's kept_path and
Handler._stored (h78a, w78f, r78g). Each test kills a hand mutant that test_serve_responses.py
let live (its docstring names it: "m78i-N"), on the real in-process server of the structured
output engines (test_serve_responses.py's ``guided``) and the OpenAI SDK."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from tests.cli.test_serve import _get, _post  # noqa: E402
from tests.cli.test_serve_responses import _client, guided  # noqa: E402, F401  (fixtures)


def _send(url: str, method: str, path: str, key: str | None = None) -> int:
    """A request with no body: its status."""
    req = urllib.request.Request(url + path, method=method, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_delete_needs_the_api_key(guided):  # noqa: F811
    """m78i-C11: do_DELETE without its _authorised check: with --api-key, a client without the key
    deleted any kept response (GET was guarded, DELETE not). A 401, the response still kept."""
    url, app = guided
    r = _client(url).responses.create(model="tiny", input="paint it", max_output_tokens=1)
    app.api_key = "k"
    try:
        assert _send(url, "DELETE", f"/v1/responses/{r.id}") == 401
        assert _send(url, "GET", f"/v1/responses/{r.id}", "k") == 200
        assert _send(url, "DELETE", f"/v1/responses/{r.id}", "k") == 200
    finally:
        app.api_key = None


def test_input_items_are_openais_list(guided):  # noqa: F811
    """input_items as OpenAI lists them, read raw (the SDK's models let a wrong part type or a
    missing field through): m78i-R27, an assistant message sent with a string content is a part
    of type output_text (input_text, a user's, lived); m78i-R28, with its annotations []; m78i-R38,
    first_id the page's first item (its last lived: the SDK pages by last_id); m78i-C12, HEAD of
    the list answers as its GET (HEAD was passed on as the method: a 404 for a response
    'X/input_items')."""
    url, _ = guided
    sent = [{"role": "user", "content": "paint it"}, {"role": "assistant", "content": "done"},
            {"role": "user", "content": "again"}]
    r = _client(url).responses.create(model="tiny", input=sent, max_output_tokens=1)
    code, listed = _get(url, f"/v1/responses/{r.id}/input_items?order=asc")
    assert code == 200, listed
    parts = [(x["role"], x["content"]) for x in listed["data"]]
    assert parts == [("user", [{"type": "input_text", "text": "paint it"}]),
                     ("assistant", [{"type": "output_text", "text": "done", "annotations": []}]),
                     ("user", [{"type": "input_text", "text": "again"}])], parts
    assert (listed["first_id"], listed["last_id"]) == (listed["data"][0]["id"], listed["data"][-1]["id"])
    assert _send(url, "HEAD", f"/v1/responses/{r.id}/input_items") == 200
    assert _send(url, "HEAD", f"/v1/responses/{r.id}") == 200


def test_a_responses_query_is_read_as_its_route_takes_it(guided):  # noqa: F811
    """m78i-R30: GET /v1/responses/{id} takes no query (input_items' limit / order / after taken
    there too, and ignored); m78i-R32: a parameter given twice is its last value, as parse_qs'
    list is read everywhere here (its first lived)."""
    url, _ = guided
    c = _client(url)
    r1 = c.responses.create(model="tiny", input="paint it", max_output_tokens=1)
    r2 = c.responses.create(model="tiny", previous_response_id=r1.id, input="again", max_output_tokens=1)
    code, body = _get(url, f"/v1/responses/{r2.id}?limit=1")
    assert code == 400 and body["error"]["param"] == "limit" and "not supported here" in body["error"]["message"], body
    code, body = _get(url, f"/v1/responses/{r2.id}/input_items?limit=1&limit=2")
    assert code == 200 and len(body["data"]) == 2 and body["has_more"], body


def test_a_previous_response_id_not_a_string_is_a_400_naming_it(guided):  # noqa: F811
    """m78i-R10: context's type check of previous_response_id dropped: a number went to the
    store's lookup and its 400's words (format spec '.80' of an int: ValueError, the connection
    dropped on a traceback). A 400 naming the field and what it takes."""
    url, _ = guided
    code, body = _post(url, "/v1/responses", {"model": "tiny", "input": "x", "previous_response_id": 5})
    assert code == 400 and body["error"]["param"] == "previous_response_id", body
    assert "'previous_response_id' must be a string; got 5" in body["error"]["message"], body


def test_a_forced_answer_nested_past_the_decoders_depth_is_text():
    """m78i-T13: _whole_items catching ValueError alone: a required answer cut by max_tokens
    inside parameters nested past json's recursion limit (a schema's free-form value; the
    grammar bounds no depth) raised RecursionError out of forced_message (the server's 500, the
    stream's error). Cut inside a call, the answer is its text, finish "length", as any cut call."""
    from specrt.tool_calls import forced_message

    text = '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {"x": ' + "[" * 100000
    assert forced_message(text, "length", "required") == ({"role": "assistant", "content": text}, "length")


def test_a_folder_not_a_hub_snapshot_of_a_repository_is_served_by_its_own_name():
    """m78i-C17: served_name without its `len(repo) > len("models--")` check: a snapshot under a
    folder named "models--" alone (no ORG--NAME after it) was served as the model "" (an id no
    request can name); m78i-C15: without its `p.parent.name == "snapshots"` check, any folder two
    below a models--ORG--NAME one (its blobs/, refs/) was served as ORG/NAME. Each is its own
    folder's name, as any other folder's."""
    from specrt.cmd_serve import served_name

    assert served_name("/data/models--/snapshots/0123abc") == "0123abc"
    assert served_name("/data/models--me--sql-lora/blobs/0123abc") == "0123abc"


def test_a_forced_answers_calls_keep_its_finish_and_parallel_tool_calls():
    """forced_message / ForcedCalls, read whole: m78i-T9, parallel_tool_calls false gives the
    first call alone (all of them lived); m78i-T10, required's whole calls of an answer cut by
    max_tokens keep finish "length" ("tool_calls" lived); m78i-T6, a named function's answer cut
    by max_tokens is its text even where the cut text parses (a call lived); m78i-T3, an empty
    piece sends nothing (a header and an empty arguments delta lived)."""
    from specrt.tool_calls import ForcedCalls, forced_message

    two = '[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {"x": 1}}]'
    msg, finish = forced_message(two, "stop", "required", parallel=False)
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["a"] and finish == "tool_calls"
    msg, finish = forced_message(two[:-1] + ", ", "length", "required")
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["a", "b"] and finish == "length"
    assert forced_message('{"x": 1}', "length", "paint") == ({"role": "assistant", "content": '{"x": 1}'}, "length")
    assert ForcedCalls("paint").push(0, "") == {}


def test_reasoning_tokens_leave_out_the_thinking_tags_generated_before_it():
    """m78i-R26: reasoning_tokens counting the tokens up to the reasoning's end, not from its start
    (`- within(at)` dropped): a <think> the model generated itself (a template that does not
    open the thinking for it) was counted as reasoning. Counted on the ids, as the decode writes."""
    from specrt.responses import reasoning_tokens

    vocab = ["<think>", "ab", "c", "</think>", "x"]
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    assert reasoning_tokens(decode, [0, 1, 2, 3, 4], "abc") == 2
    assert reasoning_tokens(decode, [1, 2, 3, 4], "abc") == 2 and reasoning_tokens(decode, [0, 1], "") == 0
