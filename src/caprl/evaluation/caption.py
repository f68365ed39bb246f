"""``caprl caption``: a trained run's captions of any images (a folder, or files), as JSON and HTML.

The images go through the backbone the checkpoint was trained on, rebuilt from its provenance
record (:func:`caprl.io.provenance.features_record`: name, settings, sizes) and checked against
it; a backbone or features file other than the checkpoint's is refused, naming both. The
captions come from the decoder of ``decode.method`` with every ``decode:`` setting (the run's
own on top, then the command line's), through :data:`caprl.decoding.DECODERS` and
:func:`caprl.decoding.decode_split` as in ``caprl evaluate``, on the model's device.

An image that cannot be read is skipped with one warning naming it, and listed with the reason
under ``skipped``. Output (``--out``, written atomically after every image is captioned)::

    {"captions": [{"file": <name under its folder>, "path": <as read>, "caption": "...",
                   "logprob": <summed log-probability of its words and end token>}, ...],
     "skipped": [{"file", "path", "reason"}, ...],
     "made_by": {"checkpoint", "run", "dataset", "method", "model", "backbone": {"name", "settings"},
                 "decode": {...}, "images": [...], "code_version", "trained_with": <its code version>}}

``logprob`` is the caption read back through the model with every stage fed its words, as beam
search feeds them: the beam's own score when the decoder is a plain beam search. ``--html``
also writes a self-contained page (:mod:`caprl.evaluation.caption_page`): each image with its
caption and, for a model with attention over a grid, the maps of every word.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml
from PIL import Image
from tqdm import tqdm

from caprl import decoding, io, params as params_mod
from caprl.data.vocab import Vocab
from caprl.decoding import DECODERS, captured
from caprl.decoding import lookahead  # noqa: F401  (registers the lookahead decoder)
from caprl.device import default_device
from caprl.errors import CaprlError
from caprl.evaluation import caption_page
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

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
_UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


@dataclass(frozen=True)
class ImageFile:
    name: str  # relative to the folder it was found in (the file as given, for a file)
    path: Path


def find_images(inputs: Sequence[str]) -> list[ImageFile]:
    """The image files of ``inputs`` (folders: their files with an image suffix, recursively,
    in name order; files: as given), each once; a CaprlError for a path that does not exist."""
    found: dict[Path, ImageFile] = {}
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise CaprlError(f"--images {given}: no image files in this folder ({', '.join(IMAGE_SUFFIXES)})")
            for p in files:
                found.setdefault(p.resolve(), ImageFile(p.relative_to(path).as_posix(), p))
        elif path.is_file():
            found.setdefault(path.resolve(), ImageFile(given, path))
        else:
            raise CaprlError(f"--images {given}: no such file or folder")
    return list(found.values())


def read_image(path: Path) -> Image.Image:
    """The fully decoded RGB image; OSError/ValueError (PIL's) for a file that is not one."""
    with Image.open(path) as img:
        img.load()
        return img.convert("RGB")


def readable_images(files: Sequence[ImageFile]) -> tuple[list[ImageFile], list[dict[str, str]]]:
    """The files that decode, and ``{"file", "path", "reason"}`` of each that does not (one
    warning each, naming it)."""
    good, skipped = [], []
    for f in tqdm(files, desc="read images", unit="img", mininterval=2.0, disable=None):
        try:
            read_image(f.path)
        except _UNREADABLE as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("%s: skipped, not a readable image (%s)", f.path, reason)
            skipped.append({"file": f.name, "path": str(f.path), "reason": reason})
            continue
        good.append(f)
    return good, skipped


class ImageFeatures:
    """``features_of(ids)`` of :func:`caprl.decoding.decode_split` for image files: file ``ids[k]``
    read and run through the backbone (on the reading thread, while the model decodes)."""

    def __init__(self, files: Sequence[ImageFile], backbone: Backbone) -> None:
        self.files, self.backbone = list(files), backbone

    def features_of(self, ids: list[int], regions: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        images = []
        for i in ids:
            try:
                images.append(read_image(self.files[i].path))
            except _UNREADABLE as exc:  # it was readable a moment ago
                raise CaprlError(f"{self.files[i].path}: changed while being captioned ({exc}); run again") from exc
        pooled, grid = self.backbone(torch.stack([self.backbone.preprocess(img) for img in images]))
        return pooled, grid if regions else grid[:, :0]


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
    against the schema's ``decode:`` so an unknown key or a wrong type names itself."""
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


def caption_images(model: CaptionModel, features: ImageFeatures, vocab: Vocab, decode: dict[str, Any],
                   batch_size: int, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Every image's ``{"file", "path", "caption", "words", "logprob", "attention" [words, R] or None}``
    by the decoder ``decode["method"]`` with every other ``decode`` setting and ``extra`` (lookahead's)."""
    decoder = DECODERS.get(decode["method"], where="decode.method")
    # every decode: setting, and the words (the options that name words read them: remove_bad_endings)
    settings = {**{k: v for k, v in decode.items() if k != "method"}, "words": vocab.idx_to_word, **extra}

    def decode_batch(m: CaptionModel, ctx: Batch, **batch: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        tokens = decoder(m, ctx, **settings, **batch)[:, 0]
        return (tokens, *read_back(m, ctx, tokens))

    results = []
    ids = list(range(len(features.files)))
    for batch_ids, (tokens, logprob, attention) in decoding.decode_split(
            model, features.features_of, ids, decode_batch, batch_size, desc=f"caption ({decode['method']})",
            pass_pooled=True):
        for k, i in enumerate(batch_ids):
            words = vocab.decode(tokens[k].tolist())
            maps = None if attention is None else attention[k, : len(words)].float().cpu().numpy()
            results.append({"file": features.files[i].name, "path": str(features.files[i].path),
                            "caption": " ".join(words), "words": words, "logprob": float(logprob[k]),
                            "attention": maps})
    return results


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
    parser.add_argument("--batch-size", type=int, help="images per batch (default: evaluate.batch_size)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: the GPU if there is one)")
    parser.add_argument("--out", required=True, help="output: the captions (JSON)")
    parser.add_argument("--html", help="output: a self-contained page of the images and their captions")


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

    torch.manual_seed(settings.seed)  # a sampling decoder gives the same captions on every run
    files, skipped = readable_images(find_images(args.images))
    if not files:
        raise CaprlError(f"--images {' '.join(args.images)}: none of the {len(skipped)} files is a readable image")
    log.info("%d images (%d skipped), run %s, backbone %s, decode %s", len(files), len(skipped), run or "?",
             backbone.name, decode)
    captions = caption_images(model, ImageFeatures(files, backbone), vocab, decode, batch_size,
                              decoder_settings(settings, run_checks.decode_key(params, run), run, decode["method"],
                                               value))
    made_by = {"checkpoint": str(ckpt_path), "run": run, "dataset": ckpt.run["dataset"],
               "method": ckpt.run.get("method"), "model": ckpt.run.get("model"),
               "backbone": {"name": backbone.name, "settings": trained["settings"]}, "decode": decode,
               "images": list(args.images), "code_version": checkpoint.code_version(),
               "trained_with": ckpt.code_version}
    result = {"captions": [{k: c[k] for k in ("file", "path", "caption", "logprob")} for c in captions],
              "skipped": skipped, "made_by": made_by}
    page = caption_page.run_page(result, captions, grid=backbone.grid) if args.html else None  # before any write
    io.write_json(args.out, result)
    if page is not None:
        io.write_text(args.html, page)
    log.info("%d captions -> %s%s", len(captions), args.out, f", {args.html}" if args.html else "")
