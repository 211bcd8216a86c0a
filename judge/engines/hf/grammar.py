"""Grammar backends of the transformers engine: the verdict masks of constrained rows.

``GenParams.regex`` constrains each row of a batch to its own pattern. The masks are computed by one of two
libraries (``TransformersSettings.grammar_backend``, vLLM's names): ``xgrammar`` (default) or ``guidance``
(llguidance); xgrammar's kernel applies the mask either way (the masks share one bit layout, as in vLLM). Masks are
filled on ``grammar_threads`` threads (default 1: for the judge's cheap patterns more threads cost more than they
save; 8 paid for a counted repetition). :class:`Grammars` holds one engine's compiled patterns and threads; the row
classes hold one batch's matchers; :mod:`judge.engines.hf.mask` applies them to the scores.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from judge.engines.base import EngineError
from judge.engines.hf.line_bound import LineTable
from judge.engines.settings import GRAMMAR_BACKENDS


def grammar_available(backend: str) -> bool:
    """True when xgrammar (it applies every mask) and the library of ``backend`` are installed."""
    return (importlib.util.find_spec("xgrammar") is not None
            and importlib.util.find_spec(GRAMMAR_BACKENDS[backend]) is not None)


class Grammars:
    """One engine's grammar backend: the vocabulary as the libraries see it, each pattern compiled once, the
    mask-filling threads and the line-bound table. Used on the model thread only."""

    def __init__(self, backend: str, threads: int, tokenizer: Any, vocab_size: int, eos_ids: list[int]) -> None:
        module = GRAMMAR_BACKENDS[backend]
        if backend != "xgrammar" and importlib.util.find_spec(module) is None:  # chosen explicitly: never silently unconstrained
            raise EngineError(f"grammar_backend {backend!r} needs {module} installed (pip install 'compeer[guidance]')")
        self.backend = backend
        self._threads = threads
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos_ids = eos_ids
        self._compiler: Any = None  # xgrammar's GrammarCompiler, or llguidance's LLTokenizer
        self._pool: Any = None  # the mask-filling threads: xgrammar's BatchGrammarMatcher or an LLExecutor
        self._compiled: dict[str, Any] = {}
        self._token_info: Any = None  # xgrammar's TokenizerInfo (both backends read the token bytes from it)
        self._lines: LineTable | None = None

    def tokenizer_info(self) -> Any:
        """xgrammar's view of the vocabulary (token bytes, special tokens), built once."""
        if self._token_info is None:
            import xgrammar as xgr

            self._token_info = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self.vocab_size,
                                                                  stop_token_ids=self._eos_ids)
        return self._token_info

    def line_table(self) -> LineTable:
        """The token byte lengths of the line bound, built once."""
        if self._lines is None:
            info = self.tokenizer_info()
            self._lines = LineTable([bytes(t) for t in info.decoded_vocab], self.vocab_size,
                                    set(info.special_token_ids) | set(self._eos_ids))
        return self._lines

    def compile(self, pattern: str | None) -> Any:
        """The backend's compiled grammar of a regex, once per pattern: xgrammar's CompiledGrammar, or an llguidance
        matcher in its start state that each row copies. Raises :class:`EngineError` naming the library's reason."""
        if pattern is None:
            return None
        if pattern not in self._compiled:
            if self.backend == "xgrammar":
                import xgrammar as xgr

                if self._compiler is None:
                    self._compiler = xgr.GrammarCompiler(self.tokenizer_info())
                    self._pool = xgr.BatchGrammarMatcher(self._threads)
                try:
                    self._compiled[pattern] = self._compiler.compile_regex(pattern)
                except RuntimeError as exc:
                    raise EngineError(f"regex rejected by xgrammar: {' '.join(str(exc).split())[:300]}") from exc
            else:
                import llguidance

                if self._compiler is None:
                    self._compiler = guidance_tokenizer(self._tokenizer, self.tokenizer_info(), self.vocab_size,
                                                        self._eos_ids)
                    self._pool = llguidance.LLExecutor(self._threads)
                grammar = llguidance.LLMatcher.grammar_from_regex(pattern)
                error = llguidance.LLMatcher.validate_grammar(grammar, self._compiler)
                if error:
                    raise EngineError(f"regex rejected by llguidance: {' '.join(error.split())[:300]}")
                self._compiled[pattern] = llguidance.LLMatcher(self._compiler, grammar)
        return self._compiled[pattern]

    def rows(self, patterns: list[str | None]) -> XgrammarRows | GuidanceRows:
        """One matcher per row of a batch (None: the row is free)."""
        grammars = [self.compile(p) for p in patterns]
        if self.backend == "xgrammar":
            return XgrammarRows(grammars, self._pool)
        return GuidanceRows(grammars, self._pool, self._eos_ids)


def guidance_tokenizer(tok: Any, info: Any, vocab_size: int, eos_ids: list[int]) -> Any:
    """llguidance's view of a transformers tokenizer's vocabulary, checked against transformers' own tokens.

    Each token's bytes come from xgrammar's TokenizerInfo ``info`` (it detects the vocabulary type from the tokenizer
    itself); the special tokens are those transformers flags. llguidance's own reader of tokenizer.json took the
    byte-level markers of a GGUF-converted tokenizer (transformers 5.17, the GPU machines) for text: every rationale
    was rejected at its first space. Raises :class:`EngineError` when a probe's tokens do not read back.
    """
    import llguidance

    lltok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_GuidanceVocabulary(tok, info, eos_ids)),
                                   n_vocab=vocab_size, eos_token=eos_ids)
    probe = "Rationale: The seeker's issue, named.\nVerdict: True"
    matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(
        'start: "' + probe.replace("\n", "\\n") + '"'))
    ids = tok.encode(probe, add_special_tokens=False)
    if not (all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()):
        raise EngineError("llguidance reads this tokenizer's tokens differently from transformers "
                          f"({' '.join(matcher.get_error().split())[:200]}); use --grammar-backend xgrammar")
    return lltok


class _GuidanceVocabulary:
    """The vocabulary as ``llguidance.TokenizerWrapper`` reads it: token bytes, special and EOS ids, a tokenizer."""

    def __init__(self, tok: Any, info: Any, eos_ids: list[int]) -> None:
        self._tok = tok
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = tok.bos_token_id
        self.tokens = [bytes(t) for t in info.decoded_vocab]
        self.special_token_ids = sorted({i for i, t in tok.added_tokens_decoder.items() if t.special}
                                        | set(tok.all_special_ids))

    def __call__(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))


class XgrammarRows:
    """One xgrammar matcher per constrained row; masks filled on the engine's BatchGrammarMatcher threads."""

    def __init__(self, grammars: list[Any], pool: Any) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._pool = pool
        self._matchers: list[Any] = [None if g is None else xgr.GrammarMatcher(g) for g in grammars]

    def __len__(self) -> int:
        return len(self._matchers)

    def live(self) -> list[int]:
        """Rows still constrained: they have a grammar and have not ended it (EOS accepted)."""
        return [i for i, m in enumerate(self._matchers) if m is not None and not m.is_terminated()]

    def accept(self, rows: list[int], tokens: list[int]) -> None:
        """Advance ``rows`` by their new tokens; a row whose token its grammar rejects is no longer constrained."""
        accepted = self._xgr.BatchGrammarMatcher.batch_accept_token([self._matchers[i] for i in rows], tokens)
        for i, ok in zip(rows, accepted):
            if not ok:
                self._matchers[i] = None

    def fill(self, rows: list[int], mask: Any) -> None:
        """Write the next-token masks of ``rows`` into their rows of ``mask``."""
        self._pool.batch_fill_next_token_bitmask([self._matchers[i] for i in rows], mask, indices=rows)


class GuidanceRows:
    """One llguidance matcher per constrained row (a copy of the pattern's start-state matcher); masks filled on
    the engine's LLExecutor threads. The same contract as :class:`XgrammarRows`."""

    def __init__(self, grammars: list[Any], pool: Any, eos_ids: list[int]) -> None:
        import llguidance.torch

        self._fill = llguidance.torch.fill_next_token_bitmask_par
        self._pool = pool
        self._eos = set(eos_ids)
        self._matchers: list[Any] = [None if g is None else g.deep_copy() for g in grammars]
        self._ended = [False] * len(grammars)

    def __len__(self) -> int:
        return len(self._matchers)

    def live(self) -> list[int]:
        return [i for i, m in enumerate(self._matchers) if m is not None and not self._ended[i]]

    def accept(self, rows: list[int], tokens: list[int]) -> None:
        for i, token in zip(rows, tokens):
            if token in self._eos:  # the row's generation ends here (EOS is masked out until the grammar allows it)
                self._ended[i] = True
            elif not self._matchers[i].consume_token(token):
                self._matchers[i] = None

    def fill(self, rows: list[int], mask: Any) -> None:
        self._fill(self._pool, [(self._matchers[i], i) for i in rows], mask)
