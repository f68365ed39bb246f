"""``caprl caption``: a trained run's captions of any images (a folder, or files), as JSON and HTML.

The images go through the backbone the checkpoint was trained on, rebuilt from its provenance
record (:func:`caprl.io.provenance.features_record`: name, settings, sizes) and checked against
it; a backbone or features file other than the checkpoint's is refused, naming both. The
captions come from the decoder of ``decode.method`` with every ``decode:`` setting (the run's
own on top, then the command line's; an option that decoder would ignore is refused, in the
plan's words: :func:`caprl.decoding.options.options_problem`), through
:data:`caprl.decoding.DECODERS` as in ``caprl evaluate``, on the model's device.

Any number of images, in bounded memory: they are read a batch at a time (``--batch-size``,
default ``evaluate.batch_size``; the next batch read while this one decodes), each image let go
as soon as it is through the backbone (the page keeps a thumbnail of it), and each batch's
captions are written out before the next batch is decoded.

A file that cannot be read (not an image, truncated, a folder or a FIFO named like an image, a
symbolic link loop or a broken link, no permission) is skipped with one warning naming it, and
listed with the reason under ``skipped`` (and on the page); the reading is
:mod:`caprl.evaluation.caption_folder`'s. Output (``--out``)::

    {"captions": [{"file": <name under its folder>, "path": <as read>, "caption": "...",
                   "logprob": <summed log-probability of its words and end token>}, ...],
     "skipped": [{"file", "path", "reason"}, ...],
     "made_by": {"checkpoint", "run", "dataset", "method", "model", "backbone": {"name", "settings"},
                 "decode": {...}, "images": [...], "code_version", "trained_with": <its code version>}}

``logprob`` is the caption read back through the model with every stage fed its words, as beam
search feeds them: the beam's own score when the decoder is a plain beam search. ``--html``
also writes a self-contained page (:mod:`caprl.evaluation.caption_page`): each image's
thumbnail with its caption and, for a model with attention over a grid, the maps of every word.

Both outputs or neither (:func:`both_or_neither`): they are written into temporary files beside
their targets, made before the first image is read (a folder that cannot hold them fails
then), and put in place together once every image is captioned; a path that cannot hold an
output (a folder there, a file where its folder should be) is refused before any work.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

import torch
import yaml
from tqdm import tqdm

from caprl import decoding, io, params as params_mod
from caprl.data.vocab import Vocab
from caprl.decoding import DECODERS, captured
from caprl.decoding import lookahead  # noqa: F401  (registers the lookahead decoder)
from caprl.decoding import options as decode_options
from caprl.data.prefetch import Prefetcher
from caprl.device import default_device
from caprl.errors import CaprlError
from caprl.evaluation import caption_page
from caprl.evaluation.caption_folder import BatchReader, ImageFile, ReadBatch, find_images, identity
from caprl.evaluation.run import decoder_settings, run_decode
from caprl.evaluation.settings import EvalSettings
from caprl.data.readers import media_of
from caprl.features.backbones import Backbone, ResNetBackbone, build_backbone
from caprl.io import provenance
from caprl.models import CaptionModel, checkpoint
from caprl.models.base import Batch
from caprl.objectives import run_checks
from caprl.objectives.value import value_from_checkpoint
from caprl.io import layout

log = logging.getLogger(__name__)

def trained_features(ckpt_path: str, made_from: dict[str, Any], features_path: str | None,
                     backbone: str | None) -> dict[str, Any]:
    """What the checkpoint was trained on (:func:`caprl.io.provenance.features_record`): its own
    record, checked against ``features_path``'s and the asked ``backbone``; a CaprlError naming
    both where they differ, or where nothing says it (an older checkpoint and no ``--features``)."""
    trained = dict(made_from.get("features") or {})
    if features_path:
        from caprl.data.feature_store import open_features_file

        with open_features_file(features_path) as h5:
            attrs = dict(h5.attrs)
        if attrs.get("media") == "video":
            raise CaprlError(f"{features_path} holds video features ({attrs.get('frames')} frames per GIF): "
                             "caprl caption captions still images; give a run trained on an image dataset")
        given = provenance.features_record(attrs)
        differ = [k for k in ("backbone", "settings", "dim", "n_regions") if trained and trained.get(k) != given[k]]
        if differ:
            what = "; ".join(f"{k} {trained.get(k)!r} in {ckpt_path}, {given[k]!r} in {features_path}" for k in differ)
            raise CaprlError(f"{ckpt_path} was trained on other features than {features_path} ({what}): give the "
                             "features file it was trained on, or none (the checkpoint records its own)")
        trained = trained or given
    if not trained:
        raise CaprlError(f"{ckpt_path} records no features (made by an older caprl): pass --features, the "
                         "features file it was trained on, so that the images get the same backbone and settings")
    if backbone and backbone != trained["backbone"]:
        raise CaprlError(f"--backbone {backbone}: {ckpt_path} was trained on {trained['backbone']} features "
                         f"({trained['settings']}), so it cannot caption {backbone} features: drop --backbone "
                         f"(the checkpoint's own is used), or caption with a run trained on {backbone} features")
    return trained


def rebuild_backbone(trained: dict[str, Any], ckpt_path: str, shape: dict[str, int]) -> Backbone:
    """The backbone of ``trained`` (a features record) from its recorded settings, checked to
    give the same settings and sizes as recorded and as the model reads."""
    name = str(trained["backbone"])
    if name == params_mod.BOTTOMUP:
        raise CaprlError(f"{ckpt_path} was trained on bottom-up-attention boxes, which come from a detector's TSV "
                         "files (caprl bottomup): caprl caption cannot make them from images")
    try:
        backbone = build_backbone({"backbone": name, name: dict(trained["settings"])})
    except KeyError as exc:
        raise CaprlError(f"{ckpt_path}: its record of the {name} backbone's settings lacks {exc} "
                         f"({trained['settings']}): pass --features, the features file it was trained on") from exc
    built = provenance.features_record(backbone.attrs())
    differ = [f"{k} {trained.get(k)!r} recorded, {built[k]!r} built" for k in ("settings", "dim", "n_regions")
              if trained.get(k) != built[k]]
    differ += [f"model reads {k} {shape[k]}, backbone gives {built[b]}"
               for k, b in (("feat_dim", "dim"), ("n_regions", "n_regions")) if k in shape and shape[k] != built[b]]
    if differ:
        raise CaprlError(f"{ckpt_path}: the {name} backbone built from its record does not give the features it was "
                         f"trained on ({'; '.join(differ)}): were the backbone's weights remade? Caption with "
                         "the caprl and weights that trained it")
    return backbone


def decode_settings(params: dict[str, Any], run: str, record: dict[str, Any], method: str | None,
                    beam_size: int | None, overrides: Sequence[str], params_files: Sequence[str]) -> dict[str, Any]:
    """The run's ``decode:`` (:func:`caprl.evaluation.run.run_decode`) with ``--method``,
    ``--beam-size`` and each ``--decode KEY=VALUE`` (VALUE read as YAML) on top, checked
    against the schema's ``decode:`` so an unknown key or a wrong type names itself, and for
    options the decoder would ignore (:func:`caprl.decoding.options.options_problem`)."""
    decode = run_decode(params, run, record) if run else dict(params["decode"])
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CaprlError(f"--decode {item}: expected KEY=VALUE (e.g. --decode max_length=12)")
        decode[key.strip()] = yaml.safe_load(value)
    decode.update({k: v for k, v in (("method", method), ("beam_size", beam_size)) if v is not None})
    files = params_mod.files_of(params_files)
    try:
        params_mod.validate({**params_mod.read(files), "decode": decode}, params_mod.find_schema(files[0]),
                            source="decode settings (params.yaml, --method, --beam-size, --decode)")
    except CaprlError as exc:  # one line per key: made one line, as the CLI shows one
        raise CaprlError("; ".join(line.strip() for line in str(exc).splitlines()[1:])) from None
    DECODERS.get(decode["method"], where="decode.method")
    problem = decode_options.options_problem(decode, "decode")  # an option its decoder would ignore: as the plan
    if problem is not None:
        raise CaprlError(f"{problem} [decode settings of run {run or '?'}: its decode: with --method, --beam-size "
                         "and --decode on top]")
    return decode


@torch.no_grad()
def read_back(model: CaptionModel, ctx: Batch, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each caption of ``tokens [B, T]`` (0 from its end on) read back through the model, every
    stage fed its words: the summed log-probability ``[B]`` of its words and end token (none
    for a caption that fills all T), and the last stage's attention ``[B, T, R]`` at each word
    (None for a model without attention)."""
    batch, length = tokens.shape
    ended_before = torch.cumsum((tokens == 0).long(), dim=1) - (tokens == 0).long()
    live = (ended_before == 0).float()  # the words and the end token
    state = model.init_state(ctx)
    prev = tokens.new_zeros(batch, model.n_stages)
    picked, maps = [], []
    for t in range(length):
        out = model.step(prev, ctx, state)
        state = out.state
        picked.append(out.logprobs[:, -1].gather(1, tokens[:, t : t + 1]).squeeze(1))
        if out.attention is not None:
            maps.append(out.attention[:, -1])
        prev = tokens[:, t : t + 1].expand(batch, model.n_stages)
    logprob = (torch.stack(picked, dim=1) * live).sum(dim=1)
    return logprob, torch.stack(maps, dim=1) if maps else None


def caption_batches(model: CaptionModel, files: Sequence[ImageFile], reader: BatchReader, vocab: Vocab,
                    decode: dict[str, Any], batch_size: int,
                    extra: dict[str, Any]) -> Iterator[tuple[list[dict[str, Any]], ReadBatch]]:
    """Each batch of ``batch_size`` files read by ``reader`` (the next one read by a background
    thread while this one decodes) and captioned on the model's device (eval mode, no gradient)
    by the decoder ``decode["method"]`` with every other ``decode`` setting and ``extra``
    (lookahead's): its readable images' ``{"file", "path", "caption", "words", "logprob",
    "attention" [words, R] or None}``, and the batch read."""
    decoder = DECODERS.get(decode["method"], where="decode.method")
    # every decode: setting, and the words (the options that name words read them: remove_bad_endings)
    settings = {**{k: v for k, v in decode.items() if k != "method"}, "words": vocab.idx_to_word, **extra}
    model.eval()
    device = next(model.parameters()).device
    chunks = [list(files[i : i + batch_size]) for i in range(0, len(files), batch_size)]
    with torch.no_grad(), Prefetcher(reader, chunks, depth=1) as loaded:
        for _, batch in tqdm(loaded, total=len(chunks), desc=f"caption ({decode['method']})", unit="batch",
                             mininterval=2.0, disable=None):
            if batch.pooled is None or batch.regions is None:
                yield [], batch
                continue
            pooled = batch.pooled.to(device)
            ctx = model.encode(pooled, batch.regions.to(device))
            tokens = decoder(model, ctx, **settings, pooled=pooled)[:, 0]
            logprob, attention = read_back(model, ctx, tokens)
            results = []
            for k, f in enumerate(batch.files):
                words = vocab.decode(tokens[k].tolist())
                maps = None if attention is None else attention[k, : len(words)].float().cpu().numpy()
                results.append({"file": f.name, "path": str(f.path), "caption": " ".join(words), "words": words,
                                "logprob": float(logprob[k]), "attention": maps})
            yield results, batch


JSON_KEYS = ("file", "path", "caption", "logprob")  # of each caption in --out


class CaptionsJson:
    """``--out`` written to ``out`` (an open text file) as the batches come: :meth:`add` each
    caption, then :meth:`finish` with the skipped files and ``made_by``."""

    def __init__(self, out: IO[str]) -> None:
        self.out, self.count = out, 0
        out.write('{"captions": [')

    def add(self, caption: dict[str, Any]) -> None:
        self.out.write(("\n " if self.count == 0 else ",\n ") + json.dumps({k: caption[k] for k in JSON_KEYS}))
        self.count += 1

    def finish(self, skipped: Sequence[dict[str, str]], made_by: dict[str, Any]) -> None:
        self.out.write(f'\n],\n "skipped": {json.dumps(list(skipped), indent=1)},\n '
                       f'"made_by": {json.dumps(made_by, indent=1)}\n}}\n')


def check_output(path: str | None, option: str) -> None:
    """A CaprlError, before any work, for an output path that cannot hold a file: a folder is
    there, or a file is where one of its folders should be."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise CaprlError(f"{option} {path}: a folder is there; give a file path (e.g. {target / target.name}); "
                         "nothing was written")
    folder = next((p for p in target.parents if os.path.lexists(p)), None)
    if folder is not None and not folder.is_dir():
        raise CaprlError(f"{option} {path}: {folder} is a file, not a folder, so it cannot hold {target.name}; "
                         "give a path in a folder; nothing was written")


@contextlib.contextmanager
def both_or_neither(out: str, html: str | None) -> Iterator[tuple[IO[str], IO[str] | None]]:
    """``--out`` and ``--html`` (None: no page) open for writing as temporary files beside their
    targets (:func:`caprl.io.atomic_path`: made now, so a folder that cannot hold them fails
    before any work), both put in place when the body succeeds, neither when anything fails: the
    page is put in place first, and removed again if the JSON then cannot be (a CaprlError
    naming the path that failed)."""
    page_placed = body_done = False
    try:
        with io.atomic_path(out) as json_tmp:
            with io.atomic_path(html) if html else contextlib.nullcontext(None) as page_tmp:
                with open(json_tmp, "w", encoding="utf-8") as json_out, \
                        open(page_tmp, "w", encoding="utf-8") if page_tmp else contextlib.nullcontext(None) as page:
                    yield json_out, page
                body_done = True
            page_placed = html is not None
    except BaseException as exc:
        if page_placed and html:  # without the JSON it was made with
            Path(html).unlink(missing_ok=True)
        if body_done and isinstance(exc, OSError):  # a rename (a write's failure is a WriteError already)
            where = exc.filename2 or exc.filename or out
            written = f"neither {out} nor {html} was written" if html else "nothing was written"
            raise CaprlError(f"{where}: could not be put in place ({exc.strerror or exc}); {written}") from exc
        raise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", help="a trained run's checkpoint (runs/<dataset>/<run>/best.pt)")
    parser.add_argument("--run", help="the run (with --dataset: its runs/<dataset>/<run>/best.pt; default: the "
                                      "checkpoint's), whose decode: settings apply")
    parser.add_argument("--dataset", help="the dataset the run was trained on (default: the checkpoint's)")
    parser.add_argument("--vocab", help="its vocabulary (default: data/<dataset>/vocab.json)")
    parser.add_argument("--images", nargs="+", required=True, metavar="PATH",
                        help="image folders (every image file in them) and/or image files")
    parser.add_argument("--backbone", help="refuse unless the checkpoint was trained on this backbone's features")
    parser.add_argument("--features", help="the features file the run was trained on: checked against the "
                                           "checkpoint's record (needed for a checkpoint without one)")
    parser.add_argument("--method", help="decoder (decode.method): greedy, beam, ...")
    parser.add_argument("--beam-size", type=int, help="decode.beam_size")
    parser.add_argument("--decode", action="append", default=[], metavar="KEY=VALUE",
                        help="any other decode: setting (repeatable), VALUE as YAML, e.g. --decode max_length=12")
    parser.add_argument("--batch-size", type=int, help="images read, captioned and written at a time: the memory "
                                                        "a run holds (default: evaluate.batch_size)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: the GPU if there is one)")
    parser.add_argument("--out", required=True, help="output: the captions (JSON)")
    parser.add_argument("--html", help="output: a self-contained page of the images (thumbnails) and their "
                                       "captions; written with --out, both or neither")


def load_checkpoint(args: argparse.Namespace, params: dict[str, Any]) -> tuple[str, checkpoint.Checkpoint, Vocab]:
    """The checkpoint (``--checkpoint``, or ``--run`` and ``--dataset``'s) and its vocabulary
    (``--vocab``, or its dataset's), checked: a model of still images, trained on that vocabulary."""
    if not args.checkpoint and not (args.run and args.dataset):
        raise CaprlError("give --checkpoint, or --run and --dataset (runs/<dataset>/<run>/best.pt)")
    path = args.checkpoint or layout.CHECKPOINT.format(dataset=args.dataset, run=args.run)
    ckpt = checkpoint.load(path)
    dataset = args.dataset or ckpt.run.get("dataset") or ckpt.made_from.get("dataset")
    if not dataset:
        raise CaprlError(f"{path} does not say which dataset it was trained on: pass --dataset and --vocab")
    if ckpt.run.get("dataset") and ckpt.run["dataset"] != dataset:
        raise CaprlError(f"--dataset {dataset}: {path} was trained on dataset {ckpt.run['dataset']}")
    fmt = (params["datasets"].get(dataset) or {}).get("format")
    if fmt and media_of(fmt, dataset) == "video":
        raise CaprlError(f"{path} is a video model (dataset {dataset}, format {fmt}): caprl caption captions still "
                         "images; give a run trained on an image dataset")
    vocab_path = args.vocab or layout.VOCAB.format(dataset=dataset)
    if not Path(vocab_path).is_file():
        raise CaprlError(f"vocabulary not found: {vocab_path}; pass --vocab, the vocab.json the run was trained with")
    vocab = Vocab.load(vocab_path)
    if ckpt.vocab_sha256 != vocab.sha256:
        raise CaprlError(f"{path} was trained with another vocabulary than {vocab_path} (sha256 "
                         f"{ckpt.vocab_sha256[:12]}... there, {vocab.sha256[:12]}... here): pass --vocab, the one "
                         "it was trained with")
    ckpt.run.setdefault("dataset", dataset)
    return path, ckpt, vocab


def main(args: argparse.Namespace) -> None:
    check_output(args.out, "--out")  # before any work: both outputs or neither
    check_output(args.html, "--html")
    if args.html and identity(Path(args.html)) == identity(Path(args.out)):
        raise CaprlError(f"--html {args.html} is --out {args.out}: give the page and the captions two paths")
    params = params_mod.load(args.params)
    settings = EvalSettings.from_params(params)  # every setting this job reads, resolved once
    torch.set_num_threads(settings.num_threads)
    captured.set_enabled(settings.cuda_graphs)
    ckpt_path, ckpt, vocab = load_checkpoint(args, params)
    run = args.run or str(ckpt.run.get("name") or "")
    trained = trained_features(ckpt_path, ckpt.made_from, args.features, args.backbone)
    backbone = rebuild_backbone(trained, ckpt_path, dict(ckpt.module(checkpoint.MODEL, where=ckpt_path).shape))
    decode = decode_settings(params, run, ckpt.run, args.method, args.beam_size, args.decode, args.params)
    if ckpt.run.get("method"):  # what `caprl evaluate` refuses too
        run_checks.refuse(run_checks.decoder_problem(run, ckpt.run["method"], decode["method"], "decode.method"))
    batch_size = args.batch_size or settings.batch_size
    if batch_size < 1:
        raise CaprlError(f"--batch-size {batch_size}: give at least 1 image per batch")
    device = torch.device(args.device) if args.device else default_device()
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CaprlError(f"--device {args.device}: this machine has no CUDA device; use --device cpu")
    if isinstance(backbone, ResNetBackbone):  # a CNN backbone runs where the model does
        backbone.device, backbone.model = device, backbone.model.to(device)
    model = checkpoint.model_from_checkpoint(ckpt).to(device)
    value = value_from_checkpoint(ckpt, where=ckpt_path)
    value = value.to(device).eval() if value is not None else None
    extra = decoder_settings(settings, run_checks.decode_key(params, run), run, decode["method"], value)

    files = find_images(args.images)
    log.info("%d image files, run %s, backbone %s, decode %s, %d per batch", len(files), run or "?", backbone.name,
             decode, batch_size)
    made_by = {"checkpoint": str(ckpt_path), "run": run, "dataset": ckpt.run["dataset"],
               "method": ckpt.run.get("method"), "model": ckpt.run.get("model"),
               "backbone": {"name": backbone.name, "settings": trained["settings"]}, "decode": decode,
               "images": list(args.images), "code_version": checkpoint.code_version(),
               "trained_with": ckpt.code_version}
    torch.manual_seed(settings.seed)  # a sampling decoder gives the same captions on every run
    reader = BatchReader(backbone, regions=model.reads_regions, page=bool(args.html))
    skipped: list[dict[str, str]] = []
    with both_or_neither(args.out, args.html) as (json_out, page_out):
        captions = CaptionsJson(json_out)
        page = caption_page.RunPage(page_out, backbone.grid, Path(args.html).parent) if page_out else None
        try:
            for results, batch in caption_batches(model, files, reader, vocab, decode, batch_size, extra):
                skipped += batch.skipped
                for k, c in enumerate(results):
                    captions.add(c)
                    if page is not None:
                        page.add(c, batch.views[k])
            if captions.count == 0:
                raise CaprlError(f"--images {' '.join(args.images)}: none of the {len(skipped)} files is a readable "
                                 "image; nothing was written")
            captions.finish(skipped, made_by)
            if page is not None:
                page.finish(made_by, skipped)
        finally:
            if page is not None:
                page.close()
    log.info("%d captions (%d files skipped) -> %s%s", captions.count, len(skipped), args.out,
             f", {args.html}" if args.html else "")
