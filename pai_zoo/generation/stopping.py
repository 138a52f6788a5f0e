"""The stop rules of one completion (EOS, stop strings, ``max_new_tokens``) and streamed text."""

from __future__ import annotations

from collections.abc import Callable

from .params import GenerationError, SamplingParams


class Finisher:
    """The stop rules for one completion, fed one token at a time.

    ``add(token)`` returns True when the completion is over (EOS, a stop string in the decoded
    text, or ``max_new_tokens``). ``on_text(delta)`` (optional) receives the text as it becomes
    final: text that might still turn into a stop string, and incomplete UTF-8 (shown as
    U+FFFD), is held back until it cannot.
    """

    def __init__(
        self,
        params: SamplingParams,
        eos_ids,
        decode: Callable[[list[int]], str] | None,
        on_text: Callable[[str], None] | None = None,
    ):
        self.params = params
        self.eos = frozenset(eos_ids)
        self.decode = decode
        self.on_text = on_text
        self.tokens: list[int] = []
        self.reason: str | None = None
        self._cut: int | None = None
        self._emitted = 0
        if (params.stop or on_text) and decode is None:
            raise GenerationError("stop strings and streaming need a tokenizer to decode the tokens")
        self._hold = max((len(s) for s in params.stop), default=1) - 1

    @property
    def done(self) -> bool:
        return self.reason is not None

    def add(self, token: int) -> bool:
        if self.done:
            return True
        self.tokens.append(int(token))
        if token in self.eos:
            self.reason = "eos"
        elif self.params.stop or self.on_text:
            text = self.decode(self.tokens)
            hits = [i for i in (text.find(s) for s in self.params.stop) if i >= 0]
            if hits:
                self.reason, self._cut = "stop", min(hits)
            elif self.on_text:
                safe = len(text) - self._hold
                while safe > self._emitted and text[safe - 1] == "\ufffd":
                    safe -= 1
                self._emit(text, safe)
        if not self.done and len(self.tokens) >= self.params.max_new_tokens:
            self.reason = "length"
        if self.done and self.on_text:
            final = self.text()
            self._emit(final, len(final))
        return self.done

    def _emit(self, text: str, upto: int) -> None:
        if upto > self._emitted:
            self.on_text(text[self._emitted : upto])
            self._emitted = upto

    def text(self) -> str | None:
        """The completion's text (EOS dropped, cut before the stop string); None without a decoder."""
        if self.decode is None:
            return None
        ids = self.tokens[:-1] if self.reason == "eos" else self.tokens
        text = self.decode(ids)
        return text[: self._cut] if self._cut is not None else text


def finished_after(finisher: Finisher, tokens: list[int]) -> bool:
    """Whether ``tokens`` already end the completion (a trial on a copy, for ``generate``)."""
    trial = Finisher(finisher.params, finisher.eos, finisher.decode)
    return any(trial.add(t) for t in tokens)
