"""Mutation round m78i over session 78's guided decoding (runtime/grammar.py: Constraint's text
made when it is made, h78b): each test kills a hand mutant that the grammar tests let live (its
docstring names it: "m78i-N")."""

from __future__ import annotations

import dataclasses

import pytest

from specrt.errors import UserError
from specrt.runtime.grammar import Constraint


def test_a_constraints_key_holds_its_after():
    """m78i-G9: the key made without ``after``: a grammar held after a tag ("</think>": a
    reasoning model's answer) and the same grammar from the first token shared one key, so a
    Session's cache of compiled grammars gave one the other's (the tag's tokens then forced or
    refused)."""
    c = Constraint.regex("[0-9]+")
    after = dataclasses.replace(c, after="</think>")
    assert after.after == "</think>" and c.key() != after.key()
    assert dataclasses.replace(c, after="</think>").key() == after.key()


def test_a_self_holding_value_is_refused_naming_it():
    """m78i-G10: __post_init__ catching TypeError alone: a schema that holds itself (a client
    library's object graph, json's ValueError "Circular reference detected") raised out of the
    Constraint's making (serve's 500) where a set is a UserError naming it."""
    schema = {"type": "object", "properties": {}}
    schema["properties"]["self"] = schema
    with pytest.raises(UserError, match=r"^response_format: expected JSON data \(Circular reference detected"):
        Constraint.json_schema(schema, "response_format")
