"""Caption grammar of the synthetic image dataset.

A scene is a few objects (shape, colour, size, cell of a 3x3 layout grid). ``describe``
returns reference sentences in several phrasings with synonyms; for scenes of several
objects some references mention only the salient (largest, then most central) object, so
that diversity and discriminability metrics have something to measure. The vocabulary is
small (about 70 words) so that every word is frequent in a ~1,000-image training split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "orange")
SIZES: tuple[str, ...] = ("small", "large")

# synonyms: (phrase, weight); the first is the most frequent
SHAPE_WORDS: dict[str, list[tuple[str, float]]] = {
    "circle": [("circle", 0.5), ("ball", 0.3), ("disc", 0.2)],
    "square": [("square", 0.5), ("box", 0.3), ("block", 0.2)],
    "triangle": [("triangle", 1.0)],
    "cross": [("cross", 0.6), ("plus sign", 0.4)],
}
SIZE_WORDS: dict[str, list[tuple[str, float]]] = {
    "small": [("small", 0.5), ("little", 0.3), ("tiny", 0.2)],
    "large": [("large", 0.6), ("big", 0.4)],
}
# (col, row) of the 3x3 layout grid -> location phrases
LOCATIONS: dict[tuple[int, int], list[tuple[str, float]]] = {
    (0, 0): [("in the top left corner", 0.5), ("at the top left", 0.3), ("in the upper left corner", 0.2)],
    (1, 0): [("at the top", 0.6), ("near the top", 0.4)],
    (2, 0): [("in the top right corner", 0.5), ("at the top right", 0.3), ("in the upper right corner", 0.2)],
    (0, 1): [("on the left", 0.6), ("on the left side", 0.4)],
    (1, 1): [("in the centre", 0.6), ("in the middle", 0.4)],
    (2, 1): [("on the right", 0.6), ("on the right side", 0.4)],
    (0, 2): [("in the bottom left corner", 0.5), ("at the bottom left", 0.3), ("in the lower left corner", 0.2)],
    (1, 2): [("at the bottom", 0.6), ("near the bottom", 0.4)],
    (2, 2): [("in the bottom right corner", 0.5), ("at the bottom right", 0.3), ("in the lower right corner", 0.2)],
}
RELATIONS: dict[str, list[tuple[str, float]]] = {
    "left": [("to the left of", 0.5), ("left of", 0.2), ("next to", 0.2), ("beside", 0.1)],
    "right": [("to the right of", 0.5), ("right of", 0.2), ("next to", 0.2), ("beside", 0.1)],
    "above": [("above", 0.7), ("over", 0.3)],
    "below": [("below", 0.5), ("under", 0.3), ("beneath", 0.2)],
}
BACKGROUND_WORDS: list[tuple[str, float]] = [("grey", 0.6), ("plain", 0.4)]
N_REFERENCES = 5


@dataclass(frozen=True)
class SceneObject:
    """What the captions talk about; pixel-level jitter lives in the renderer."""

    shape: str
    colour: str
    size: str
    col: int  # 0 left .. 2 right
    row: int  # 0 top .. 2 bottom


def pick(rng: np.random.Generator, options: Sequence[tuple[str, float]]) -> str:
    weights = np.array([w for _, w in options], dtype=float)
    return options[int(rng.choice(len(options), p=weights / weights.sum()))][0]


def salience_order(objects: Sequence[SceneObject]) -> list[SceneObject]:
    """Large before small, then nearer the centre, then scene order."""
    order = sorted(
        range(len(objects)),
        key=lambda i: (objects[i].size != "large", abs(objects[i].col - 1) + abs(objects[i].row - 1), i),
    )
    return [objects[i] for i in order]


def article(next_word: str) -> str:
    return "an" if next_word[0] in "aeiou" else "a"


def noun_phrase(obj: SceneObject, rng: np.random.Generator, size_prob: float, det: bool = True) -> str:
    words = []
    if rng.random() < size_prob:
        words.append(pick(rng, SIZE_WORDS[obj.size]))
    words += [obj.colour, pick(rng, SHAPE_WORDS[obj.shape])]
    phrase = " ".join(words)
    return f"{article(phrase)} {phrase}" if det else phrase


def relation(a: SceneObject, b: SceneObject, rng: np.random.Generator) -> str:
    """Where ``a`` is relative to ``b``; diagonal pairs use either axis."""
    horizontal = a.col != b.col
    if a.col != b.col and a.row != b.row:
        horizontal = bool(rng.random() < 0.5)
    if horizontal:
        return pick(rng, RELATIONS["left" if a.col < b.col else "right"])
    return pick(rng, RELATIONS["above" if a.row < b.row else "below"])


def location(obj: SceneObject, rng: np.random.Generator) -> str:
    return pick(rng, LOCATIONS[(obj.col, obj.row)])


Template = Callable[[list[SceneObject], np.random.Generator], str]


def _np(o: SceneObject, r: np.random.Generator) -> str:
    return noun_phrase(o, r, size_prob=0.6)


# single object
ONE: list[Template] = [
    lambda s, r: noun_phrase(s[0], r, size_prob=0.8),
    lambda s, r: f"{_np(s[0], r)} {location(s[0], r)}",
    lambda s, r: f"there is {_np(s[0], r)} {location(s[0], r)}",
    lambda s, r: f"{_np(s[0], r)} on a {pick(r, BACKGROUND_WORDS)} background",
    lambda s, r: f"a picture of {_np(s[0], r)} {location(s[0], r)}",
    lambda s, r: f"{_np(s[0], r)} is {location(s[0], r)}",
    lambda s, r: f"a single {noun_phrase(s[0], r, 0.6, det=False)} {location(s[0], r)}",
]
# two objects, salient first: all objects mentioned
TWO_FULL: list[Template] = [
    lambda s, r: f"{_np(s[0], r)} {relation(s[0], s[1], r)} {_np(s[1], r)}",
    lambda s, r: f"there is {_np(s[0], r)} {relation(s[0], s[1], r)} {_np(s[1], r)}",
    lambda s, r: f"two {pick(r, [('shapes', 0.6), ('objects', 0.4)])} : {_np(s[0], r)} and {_np(s[1], r)}",
    lambda s, r: f"{_np(s[0], r)} and {_np(s[1], r)}",
    lambda s, r: f"{_np(s[1], r)} {relation(s[1], s[0], r)} {_np(s[0], r)}",
    lambda s, r: f"{_np(s[0], r)} is {relation(s[0], s[1], r)} {_np(s[1], r)}",
]
THREE_FULL: list[Template] = [
    lambda s, r: f"{_np(s[0], r)} , {_np(s[1], r)} and {_np(s[2], r)}",
    lambda s, r: f"three {pick(r, [('shapes', 0.6), ('objects', 0.4)])} : "
    f"{_np(s[0], r)} , {_np(s[1], r)} and {_np(s[2], r)}",
    lambda s, r: f"{_np(s[0], r)} {relation(s[0], s[1], r)} {_np(s[1], r)}",
    lambda s, r: f"there is {_np(s[0], r)} {relation(s[0], s[1], r)} {_np(s[1], r)}",
    lambda s, r: f"{_np(s[0], r)} {relation(s[0], s[2], r)} {_np(s[2], r)}",
]
# several objects: only the salient one mentioned
SALIENT: list[Template] = [
    lambda s, r: f"there is {_np(s[0], r)} {location(s[0], r)}",
    lambda s, r: f"{_np(s[0], r)} {location(s[0], r)}",
    lambda s, r: f"{_np(s[0], r)} with {'another shape' if len(s) == 2 else 'two other shapes'}",
    lambda s, r: f"a picture with {_np(s[0], r)}",
]


def to_raw(sentence: str) -> str:
    """Human-looking text as in the Karpathy files: capitalised, tight punctuation, full stop."""
    text = sentence.replace(" ,", ",").replace(" :", ":")
    return text[0].upper() + text[1:] + "."


def _sample(pool: list[Template], k: int, rng: np.random.Generator) -> list[Template]:
    idx = rng.choice(len(pool), size=min(k, len(pool)), replace=False)
    return [pool[int(i)] for i in idx]


def describe(objects: Sequence[SceneObject], rng: np.random.Generator, n: int = N_REFERENCES) -> list[str]:
    """``n`` distinct reference sentences (raw text) for a scene of 1-3 objects."""
    if not 1 <= len(objects) <= 3:
        raise ValueError(f"scenes have 1 to 3 objects, got {len(objects)}")
    if not 1 <= n <= N_REFERENCES:
        raise ValueError(f"at most {N_REFERENCES} references per scene, got {n}")
    scene = salience_order(objects)
    if len(scene) == 1:
        templates = _sample(ONE, n, rng)
    else:
        n_salient = int(rng.integers(1, 3))
        full = TWO_FULL if len(scene) == 2 else THREE_FULL
        templates = _sample(full, n - n_salient, rng) + _sample(SALIENT, n_salient, rng)
        rng.shuffle(templates)  # type: ignore[arg-type]
    sentences: list[str] = []
    for template in templates:
        # re-draw synonyms until distinct; a few tries always suffice in practice
        for _ in range(20):
            text = to_raw(template(scene, rng))
            if text not in sentences:
                break
        sentences.append(text)
    return sentences
