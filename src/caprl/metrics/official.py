"""The official COCO caption metrics (pycocoevalcap) behind one object that owns its JVMs.

``OfficialScorer.score(refs, results, metrics, per_image)`` PTB-tokenises references and
candidates (one Java call for both), then computes BLEU-1..4, METEOR, ROUGE-L, CIDEr-D
(pycocoevalcap's ``Cider``: document frequencies from the evaluated references) and SPICE.
METEOR's JVM is started at the first METEOR request and reused until :meth:`close` (also
called at interpreter exit). SPICE runs in caprl's SPICE server (one JVM, likewise kept),
only when its Stanford CoreNLP 3.6.0 jars are already installed (``corenlp_dir``,
``$CAPRL_CORENLP_DIR`` or pycocoevalcap's ``spice/lib``); otherwise it is reported under
``"unavailable"`` with the reason, and nothing is downloaded (``caprl setup-spice`` installs them).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging
import os
import shutil
import threading
import weakref
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from caprl.errors import CaprlError, WriteError
from caprl.io import write_cause
from caprl.metrics import meteor_pipe

if TYPE_CHECKING:
    from caprl.metrics.spice_server import SpiceServer

log = logging.getLogger(__name__)

METRICS = ("bleu", "meteor", "rouge_l", "cider_d", "spice")
METRIC_NAMES = {
    "bleu": ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"),
    "meteor": ("METEOR",),
    "rouge_l": ("ROUGE-L",),
    "cider_d": ("CIDEr-D",),
    "spice": ("SPICE",),
}
CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
CORENLP_ENV = "CAPRL_CORENLP_DIR"

_live_scorers: weakref.WeakSet[OfficialScorer] = weakref.WeakSet()


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise CaprlError(f"pycocoevalcap is not installed (cannot import {module})")
    return Path(spec.origin).parent


def require_java() -> None:
    if shutil.which("java") is None:
        raise CaprlError("java not found on PATH: the official caption metrics (PTB tokenizer, METEOR) need Java")


class MetricUnavailable(Exception):
    """A metric that cannot run here (the message says why)."""


def spice_classpath(corenlp_dir: str | Path | None = None) -> list[Path]:
    """The jars SPICE runs with: pycocoevalcap's spice-1.0.jar, its lib/ jars and CoreNLP 3.6.0.

    The CoreNLP jars are looked for in ``corenlp_dir`` (params ``spice.corenlp_dir``), then
    ``$CAPRL_CORENLP_DIR``, then pycocoevalcap's ``spice/lib``. Raises MetricUnavailable with
    the reason when something is missing; checks files only, downloads nothing.
    """
    if shutil.which("java") is None:
        raise MetricUnavailable("java not found on PATH")
    try:
        spice_dir = _package_dir("pycocoevalcap.spice.spice")
    except CaprlError as exc:
        raise MetricUnavailable(str(exc)) from None
    from caprl.metrics.spice_server import java_major_version

    version = java_major_version()
    if 0 < version < 11:
        raise MetricUnavailable(f"SPICE's server needs Java 11 or newer; java on PATH is Java {version}")
    jar = spice_dir / "spice-1.0.jar"
    if not jar.exists():
        raise MetricUnavailable(f"spice-1.0.jar missing from {spice_dir}")
    folders = [Path(d).expanduser() for d in (corenlp_dir, os.environ.get(CORENLP_ENV)) if d]
    folders.append(spice_dir / "lib")
    for folder in folders:
        if all((folder / name).is_file() for name in CORENLP_JARS):
            libs = sorted(p for p in (spice_dir / "lib").glob("*.jar") if p.name not in CORENLP_JARS)
            return [jar, *libs, *(folder / name for name in CORENLP_JARS)]
    raise MetricUnavailable(
        f"Stanford CoreNLP 3.6.0 jars not installed ({' and '.join(CORENLP_JARS)} not found in "
        f"{', '.join(str(f) for f in folders)}): run `caprl setup-spice` to download and install them, or put "
        f"them in a folder and set params spice.corenlp_dir or ${CORENLP_ENV} to it (nothing was downloaded here)"
    )


def spice_unavailable_reason(corenlp_dir: str | Path | None = None) -> str | None:
    """Why SPICE cannot run here, or None if it can (see :func:`spice_classpath`)."""
    try:
        spice_classpath(corenlp_dir)
    except MetricUnavailable as exc:
        return str(exc)
    return None


#: sentence -> its PTB tokens, for this process: each sentence goes to the tokenizer's JVM once, so a
#: job that scores several caption sets against one split (beam, greedy, diversity, lookahead)
#: tokenises the references once. Exact: the tokenizer reads one sentence per line
#: (``-preserveLines``) and drops punctuation per token, so a sentence's tokens do not depend on
#: the other sentences of the call.
_PTB_TOKENS: dict[str, str] = {}


def ptb_tokenize(captions: Mapping[Hashable, Sequence[str]]) -> dict[Hashable, list[str]]:
    """PTB-tokenise (lower-case, punctuation removed) with pycocoevalcap's PTBTokenizer: one JVM
    call for the sentences this process has not tokenised before, none when it has them all."""
    new = list(dict.fromkeys(str(c) for caps in captions.values() for c in caps if str(c) not in _PTB_TOKENS))
    if new:
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        require_java()
        try:
            tokenized = PTBTokenizer().tokenize({k: [{"caption": sentence}] for k, sentence in enumerate(new)})
        except OSError as exc:
            error = _tokenizer_write_error(exc)
            if error is None:
                raise
            raise error from exc
        _PTB_TOKENS.update((sentence, tokenized[k][0]) for k, sentence in enumerate(new) if k in tokenized)
        lost = [sentence for sentence in new if sentence not in _PTB_TOKENS]
        if lost:  # the tokenizer returned fewer lines than it was given
            raise CaprlError(f"the PTB tokenizer returned no tokens for {len(lost)} sentence(s), e.g. {lost[0]!r}")
    return {key: [_PTB_TOKENS[str(c)] for c in caps] for key, caps in captions.items()}


def _tokenizer_write_error(exc: OSError) -> WriteError | None:
    """A failed write of PTBTokenizer's temporary file as a WriteError naming it (removed first).

    pycocoevalcap writes the sentences to ``tempfile.NamedTemporaryFile(dir=<its tokenizer
    folder>, delete=False)``: beside its jar, in the installed package, whatever ``TMPDIR``
    says; a failed write leaves that file there.
    """
    cause = write_cause(exc)
    if cause is None:
        return None
    folder = _package_dir("pycocoevalcap.tokenizer.ptbtokenizer")
    path, what = folder, "the PTB tokenizer's temporary file in"  # when it could not even be created
    tb = exc.__traceback__
    while tb is not None:  # the tokenizer's frame holds the file it failed to write
        code = tb.tb_frame.f_code
        tmp_file = tb.tb_frame.f_locals.get("tmp_file") if Path(code.co_filename).parent == folder else None
        if tmp_file is not None:
            with contextlib.suppress(OSError):
                tmp_file.close()  # its buffer cannot be written either
            path, what = Path(tmp_file.name), "the PTB tokenizer's temporary file"
            path.unlink(missing_ok=True)
        tb = tb.tb_next
    hint = (f"pycocoevalcap's PTB tokenizer writes this file in its own package folder {folder}, whatever TMPDIR "
            "says: to move it, install pycocoevalcap on a filesystem with room, e.g. in a virtual environment there")
    return WriteError(path, cause[0], detail=hint, what=what)


class OfficialScorer:
    """pycocoevalcap's metrics, with METEOR's JVM started once and closed by :meth:`close`.

    Use as a context manager, or keep one per process; ``close()`` also runs at exit.
    """

    def __init__(self, corenlp_dir: str | Path | None = None) -> None:
        self.corenlp_dir = corenlp_dir  # where SPICE's CoreNLP jars are (see spice_classpath)
        self._meteor: Any = None
        self._spice: SpiceServer | None = None
        self._lock = threading.Lock()
        _live_scorers.add(self)

    # -- METEOR's long-lived JVM -------------------------------------------------------
    def meteor(self, gts: Mapping[Hashable, list[str]], res: Mapping[Hashable, list[str]]) -> tuple[float, list[float]]:
        """pycocoevalcap ``Meteor.compute_score`` on already-tokenised strings.

        When ``$CAPRL_METEOR_SOCKET`` names a live METEOR server (the workflow's shared JVM,
        :mod:`caprl.metrics.meteor_server`), the strings are scored there: the same jar and
        class on the same strings, so the same numbers, without this process paying the JVM's
        ~6 s start-up. If the variable is unset or the server is missing or fails, this scorer
        logs it once and uses its own JVM from then on.
        """
        socket_path = os.environ.get("CAPRL_METEOR_SOCKET")
        dead: set[str] = self.__dict__.setdefault("_dead_meteor_sockets", set())  # servers that failed us
        if socket_path and socket_path != "off" and socket_path not in dead:  # off: no shared server
            from caprl.metrics.meteor_client import MeteorClient

            try:
                return MeteorClient(socket_path).compute_score(gts, res)
            except CaprlError as exc:  # MeteorServerError, or a path too long for a Unix socket
                dead.add(socket_path)
                log.info("METEOR server unusable (%s); starting this process's own METEOR JVM", exc)
        with self._lock:
            if self._meteor is None:
                from pycocoevalcap.meteor.meteor import Meteor

                require_java()
                self._meteor = Meteor()
            meteor = self._meteor
        try:
            score, scores = meteor_pipe.compute_score(meteor, dict(gts), dict(res))
        except (OSError, ValueError) as exc:  # the JVM died: its pipe broke or answered nothing
            self.close()
            raise CaprlError(f"METEOR's Java process failed ({exc}); it will be restarted on the next call") from exc
        return float(score), [float(s) for s in scores]

    def close(self) -> None:
        """Stop METEOR's and SPICE's JVMs (if started). Safe to call more than once."""
        with self._lock:
            meteor, self._meteor = self._meteor, None
            spice, self._spice = self._spice, None
        if spice is not None:
            spice.close()
        if meteor is not None:
            held = meteor.lock.acquire(timeout=10)  # let a running call finish, but never hang here
            try:
                proc = meteor.meteor_p
                proc.kill()
                proc.wait()
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe:
                        with contextlib.suppress(OSError):  # unflushed input to a dead process
                            pipe.close()
            finally:
                if held:
                    meteor.lock.release()

    def __enter__(self) -> OfficialScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- full evaluation ---------------------------------------------------------------
    def score(
        self,
        refs: Mapping[int, Sequence[str]],
        results: Mapping[int, str],
        metrics: Sequence[str] = METRICS,
        per_image: bool = False,
    ) -> dict[str, Any]:
        """Score raw-sentence ``results`` (image id -> caption) against ``refs`` (image id -> captions).

        ``metrics`` is a subset of {"bleu", "meteor", "rouge_l", "cider_d", "spice"}.
        Returns ``{"corpus": {name: float}, "unavailable": {name: reason}}`` plus, with
        ``per_image``, ``"per_image": {image_id: {name: float}}``; names are "BLEU-1".."BLEU-4",
        "METEOR", "ROUGE-L", "CIDEr-D", "SPICE". Only the images of ``results`` are scored.
        """
        unknown = [m for m in metrics if m not in METRICS]
        if unknown:
            raise CaprlError(f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRICS)}")
        missing = [i for i in results if i not in refs]
        if missing:
            raise CaprlError(f"{len(missing)} result image id(s) have no references: {_preview(missing)}")
        if not results:
            raise CaprlError("no results to score")
        ids = list(results)
        tokens = ptb_tokenize({**{("ref", i): refs[i] for i in ids}, **{("res", i): [results[i]] for i in ids}})
        gts = {i: tokens[("ref", i)] for i in ids}
        res = {i: tokens[("res", i)] for i in ids}
        empty = [i for i in ids if not gts[i]]
        if empty:
            raise CaprlError(f"{len(empty)} image(s) have no reference captions: {_preview(empty)}")
        corpus: dict[str, float] = {}
        images: dict[int, dict[str, float]] = {i: {} for i in ids}
        unavailable: dict[str, str] = {}
        for metric in dict.fromkeys(metrics):
            try:
                values, per = self._compute(metric, gts, res)
            except MetricUnavailable as exc:
                unavailable[METRIC_NAMES[metric][0]] = str(exc)
                continue
            for name, value, scores in zip(METRIC_NAMES[metric], values, per):
                corpus[name] = float(value)
                for i, s in zip(ids, scores):
                    images[i][name] = float(s)
        out: dict[str, Any] = {"corpus": corpus, "unavailable": unavailable}
        if per_image:
            out["per_image"] = images
        return out

    def _compute(self, metric: str, gts: dict, res: dict) -> tuple[list[float], list[list[float]]]:
        if metric == "bleu":
            from pycocoevalcap.bleu.bleu import Bleu

            score, scores = Bleu(4).compute_score(gts, res, verbose=0)
            return list(score), [list(s) for s in scores]
        if metric == "meteor":
            score, scores = self.meteor(gts, res)
            return [score], [scores]
        if metric == "rouge_l":
            from pycocoevalcap.rouge.rouge import Rouge

            score, scores = Rouge().compute_score(gts, res)
            return [float(score)], [list(scores)]
        if metric == "cider_d":
            from pycocoevalcap.cider.cider import Cider

            score, scores = Cider().compute_score(gts, res)
            return [float(score)], [list(scores)]
        score, scores = run_spice(gts, res, self.corenlp_dir, self._spice_server())
        return [score], [scores]

    def _spice_server(self) -> SpiceServer:
        """SPICE's long-lived JVM (started at its first request, stopped by :meth:`close`)."""
        from caprl.metrics.spice_server import SpiceServer, java_command

        if self._spice is None:
            self._spice = SpiceServer(java_command(spice_classpath(self.corenlp_dir), subset=True))
        return self._spice


def run_spice(
    gts: Mapping[Hashable, list[str]],
    res: Mapping[Hashable, list[str]],
    corenlp_dir: str | Path | None = None,
    server: SpiceServer | None = None,
) -> tuple[float, list[float]]:
    """Official SPICE (F-score over all tuples): corpus mean and per-item scores (in ``gts`` order).

    SPICE 1.0's own scorer runs in caprl's SPICE server (:mod:`caprl.metrics.spice_server`;
    pycocoevalcap's ``java -jar`` call fails on Java 15+), a new one unless ``server`` is
    given. Raises MetricUnavailable (never downloads, never returns a number) when it cannot run.
    """
    from caprl.metrics.spice_server import SpiceFailed, SpiceServer, java_command

    classpath = spice_classpath(corenlp_dir)
    ids = list(gts)
    if set(res) != set(ids):
        raise CaprlError("SPICE: references and results cover different ids")
    items = [(res[i][0], gts[i]) for i in ids]
    own = server is None
    try:
        if server is None:
            server = SpiceServer(java_command(classpath, subset=True))
        scores = server.f_scores(items)
    except SpiceFailed as exc:
        raise MetricUnavailable(f"SPICE failed to run: {exc}") from exc
    finally:
        if own and server is not None:
            server.close()
    return float(np.mean(scores)), [float(s) for s in scores]


_shared: dict[str, OfficialScorer] = {}


def shared_scorer(corenlp_dir: str | Path | None = None) -> OfficialScorer:
    """This process's scorer for ``corenlp_dir``: one METEOR (and SPICE) JVM per job, however many
    caption sets the job scores; closed at exit like every scorer."""
    key = str(corenlp_dir)
    if key not in _shared:
        _shared[key] = OfficialScorer(corenlp_dir=corenlp_dir)
    return _shared[key]


def _preview(ids: Sequence[Any], limit: int = 5) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f" ... ({len(ids) - limit} more)" if len(ids) > limit else "")


@atexit.register
def _close_live_scorers() -> None:
    for scorer in list(_live_scorers):
        scorer.close()
