"""`matches_nothing`: a grammar whose root has no finite derivation is found, whatever its first token mask allows;
every grammar that matches some text (the empty text included) is not refused."""

from __future__ import annotations

import pytest
import xgrammar as xgr

from jaxchat.constrain.emptiness import matches_nothing
from jaxchat.constrain.lark_ebnf import lark_to_ebnf

COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([b"a", b"b", b"c"]))

EMPTY = {
    "regex empty class after b": lambda: xgr.Grammar.from_regex(r"a{0}b[^\s\S]"),
    "regex empty class": lambda: xgr.Grammar.from_regex(r"[^\s\S]"),
    "ebnf endless recursion": lambda: xgr.Grammar.from_ebnf('root ::= "a" root'),
    "ebnf endless pair": lambda: xgr.Grammar.from_ebnf('root ::= x\nx ::= "b" x | "c" x'),
    "ebnf repeat of an empty rule": lambda: xgr.Grammar.from_ebnf('root ::= x{1,3}\nx ::= "b" x'),
    "ebnf class of nothing": lambda: xgr.Grammar.from_ebnf('root ::= "b" [^\\0-\\U0010ffff]'),
    "lark endless recursion": lambda: xgr.Grammar.from_ebnf(lark_to_ebnf('start: "a" start')),
}
NOT_EMPTY = {
    "regex a{0} (the empty text)": lambda: xgr.Grammar.from_regex("a{0}"),
    "regex long repeat": lambda: xgr.Grammar.from_regex("[a-z]{1,5000}"),
    "regex alternation": lambda: xgr.Grammar.from_regex(r"\d+|x"),
    "ebnf recursion with an exit": lambda: xgr.Grammar.from_ebnf('root ::= "a" | "b" root'),
    "ebnf repeat from 0": lambda: xgr.Grammar.from_ebnf('root ::= x{0,3}\nx ::= "b" x'),
    "ebnf class of one character": lambda: xgr.Grammar.from_ebnf('root ::= [^\\0-\\U0010fffe]'),
    "lark recursion with an exit": lambda: xgr.Grammar.from_ebnf(lark_to_ebnf('start: "a" start | "b"')),
    "json": lambda: xgr.Grammar.builtin_json_grammar(),
}


@pytest.mark.parametrize("name", sorted(EMPTY))
def test_grammars_that_match_nothing(name):
    grammar = EMPTY[name]()
    assert matches_nothing(grammar)
    assert matches_nothing(COMPILER.compile_grammar(grammar).grammar)  # the same after xgrammar's optimisations


@pytest.mark.parametrize("name", sorted(NOT_EMPTY))
def test_grammars_that_match_text(name):
    grammar = NOT_EMPTY[name]()
    assert not matches_nothing(grammar)
    assert not matches_nothing(COMPILER.compile_grammar(grammar).grammar)


def test_structural_tags():
    def compiled(fmt):
        return COMPILER.compile_structural_tag({"type": "structural_tag", "format": fmt}).grammar

    assert matches_nothing(compiled({"type": "regex", "pattern": r"a{0}b[^\s\S]"}))
    assert not matches_nothing(compiled({"type": "triggered_tags", "triggers": ["<"], "tags": [
        {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": "</a>"}]}))


def test_an_unknown_serialization_is_never_refused():
    class Other:
        def serialize_json(self):
            return '{"__VERSION__": "v99", "rules": [], "grammar_expr_data": [], "grammar_expr_indptr": []}'

    assert not matches_nothing(Other())
    assert not matches_nothing(object())
