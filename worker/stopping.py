"""Stop sequences: generated text cut at the first stop string, without showing any of it.

Text that could be the beginning of a stop string is held back until the next piece
shows whether it is; so a streamed answer never shows part of a stop string, and the
text ends exactly where the stop string began (OpenAI's behaviour).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that is safe to show after ``piece``; sets ``stopped`` when a stop
        string completed (the text before it is returned, the rest is dropped)."""
        text = self._held + piece
        found = [at for stop in self._stops if (at := text.find(stop)) >= 0]
        if found:
            self.stopped = True
            self._held = ""
            return text[: min(found)]
        keep = self._longest_stop_prefix_at_end(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What was held back, once generation ended without a stop string."""
        held, self._held = self._held, ""
        return held

    def _longest_stop_prefix_at_end(self, text: str) -> int:
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
