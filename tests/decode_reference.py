"""Vijayakumar et al.'s diverse beam search (2016, Alg. 1 with Hamming diversity) read literally
for one image of tests/decode_toy.py's model, with the decoding rules applied word by word: the
reference that tests/test_decode_options.py (the final list, ranked by plain log-probability) and
tests/test_diverse_beam_pick.py (the groups' beams, group by group) check the search against."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from decode_toy import BAD, WORDS, TableModel, repeats_a_trigram, step_logprobs, words_of

UNK = len(WORDS) - 1

#: a beam: its words, its plain score and its selection score, both ranked by the length penalty
Beam = tuple[tuple[int, ...], float, float]


def constrained(lp: list[float], words: Sequence[int], t: int, max_length: int,
                settings: dict[str, Any]) -> list[float]:
    """One step's log-probabilities with the words the rules ban at -inf, word by word."""
    def banned(w: int) -> bool:
        if w == 0:
            return bool(settings.get("remove_bad_endings") and words and words[-1] in BAD)
        return bool((settings.get("suppress_unk") and w == UNK)
                    or (settings.get("remove_bad_endings") and t == max_length - 1 and w in BAD)
                    or (settings.get("block_trigrams") and repeats_a_trigram([*words, w])))
    return [float("-inf") if banned(w) else x for w, x in enumerate(lp)]


def diverse_groups(model: TableModel, image: float, width: int, groups: int, lam: float, max_length: int,
                   rank: Callable[[float, int], float], settings: dict[str, Any] | None = None) -> list[list[Beam]]:
    """Alg. 1 for one image: at each step the groups choose in order, group g's word w costing lam
    per beam of groups 1..g-1 that chose w at this step; a beam's selection score sums the augmented
    log-probabilities (the authors' code). Each group's final beams as (words, plain score, selection
    score), both ranked by ``rank(score, |Y|)``, each group sorted by its selection score; the words
    the rules of ``settings`` ban are never chosen."""
    per = width // groups
    # (words, log-probability, selection score, ended, length |Y|, chose a word at this step)
    beams = [[((), 0.0, 0.0, False, 0, False)] for _ in range(groups)]
    for t in range(max_length):
        counts = [0] * model.vocab_size
        for g in range(groups):
            cands = []
            for words, raw, sel, ended, length, _ in beams[g]:
                if ended:
                    cands.append((words, raw, sel, True, length, False))
                    continue
                lp = constrained(step_logprobs(model, image, words), words, t, max_length, settings or {})
                for w in range(model.vocab_size):
                    aug = lp[w] - lam * counts[w] if g else lp[w]
                    if lp[w] > float("-inf"):
                        cands.append((words + (w,), raw + lp[w], sel + aug, w == 0, t + 1, True))
            beams[g] = sorted(cands, key=lambda c: -rank(c[2], c[4]))[:per]
            for words, *_, chose in beams[g]:
                counts[words[-1]] += chose
    return [[(words_of(w), rank(raw, n), rank(sel, n)) for w, raw, sel, _, n, _ in group] for group in beams]
