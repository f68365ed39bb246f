"""``caprl evaluate``: beam-search captions of a split, scored with the official metrics.

The run's ``decode:`` is checked as the plan (``snakemake -n``) checks it, in the same words
(:func:`caprl.decoding.options.run_options_problem`): an option its decoder would ignore (``top_p``
with beam search, ``groups`` with greedy, a length penalty with sampling, ...) is an error naming
the run and the key.

A run whose checkpoint holds a value network (paper 003's ``actor_critic``) may be decoded by
lookahead inference (``decode.method: lookahead``, :mod:`caprl.decoding.lookahead`); with
``evaluate.lookahead`` set, its lookahead captions are also scored, beside the main decoding's,
into the score file's ``lookahead`` section (one evaluate job gives both rows of paper 003's
Table 1).

The score file's ``vocabulary`` (every run): the distinct words of the evaluated captions and
the share of them that is no training caption (:mod:`caprl.evaluation.vocabulary`).

The score file's ``failure_modes`` (every run): the reward-hacking signs of the evaluated captions,
bad endings, repeated bigrams, length (:mod:`caprl.evaluation.failure_modes`) and, given ``--start``
(the run's init.model), the KL of the policy to its start (:mod:`caprl.evaluation.start_kl`).

The score file's ``clip_score`` (``evaluate.clip_score``, per dataset): CLIP-S and RefCLIP-S of the
evaluated captions in the dataset's embedding (:mod:`caprl.evaluation.clip_score`).

The score file's ``validation`` (every run): the validation numbers of the epoch the checkpoint
holds, read from the checkpoint itself (:mod:`caprl.evaluation.validation`): paper 004's tables
choose their operating points on them. A checkpoint of another run or dataset than the job's is
refused (:func:`check_checkpoint`).

With ``evaluate.greedy`` set, the greedy captions (the decoding that best-epoch selection
validates with) are scored too, by the official CIDEr-D, into ``greedy``: RL methods gain most
in greedy decoding, while an XE model gains most from the beam, so the main table shows both.

No work twice in one job: every caption set is decoded first (the diversity's bs set is the
evaluation's own beam search when the widths match), then the references and every caption go
to the PTB tokenizer's JVM in one call (each sentence once per process), and one METEOR JVM
scores every set (:func:`caprl.metrics.official.shared_scorer`).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import torch

from caprl import decoding, io, params as params_mod
from caprl.decoding import captured
from caprl.models import checkpoint
from caprl.io import provenance
from caprl.objectives import run_checks
from caprl.decoding import lookahead  # noqa: F401  (registers the lookahead decoder)
from caprl.decoding import DECODERS
from caprl.errors import CaprlError
from caprl.decoding import options as decode_options
from caprl.evaluation import degenerate, validation
from caprl.evaluation.clip_score import SECTION as CLIP_SCORE, clip_score_report
from caprl.metrics.embeddings import EmbeddingInputs, add_embedding_arguments
from caprl.evaluation.diversity import TABLE4_PRECISION, official_cider_d, set_scores
from caprl.evaluation.report import score_and_record
from caprl.evaluation.settings import EvalSettings
from caprl.evaluation.vocabulary import caption_stats, training_captions
from caprl.evaluation.failure_modes import SECTION as FAILURE_MODES, failure_modes
from caprl.evaluation.start_kl import kl_to_start, start_section
from caprl.metrics.official import ptb_tokenize, shared_scorer
from caprl.metrics.score_cli import load_references
from caprl.models import CaptionModel
from caprl.objectives.value import ValueNetwork, value_from_checkpoint
from caprl.device import default_device
from caprl.data.loader import CaptionData, Loading, add_data_arguments

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="dataset name under datasets: in params.yaml")
    parser.add_argument("--run", required=True)
    parser.add_argument("--checkpoint", required=True)
    add_data_arguments(parser)
    parser.add_argument("--refs", required=True, help="COCO caption-annotation file of the split (caprl references)")
    parser.add_argument("--out-examples", required=True, help="output: a few captions beside their references")
    parser.add_argument("--out-captions", required=True, help="output: COCO results format")
    parser.add_argument("--out-scores", required=True, help="output: official metrics (JSON)")
    add_embedding_arguments(parser)  # CLIP-S's embedding (evaluate.clip_score): the workflow passes its input
    parser.add_argument("--start", default=None, help="the checkpoint the run started from (its init.model): "
                        "the KL to it goes in the failure_modes section (caprl.evaluation.start_kl)")


def decoded_sets(model: CaptionModel, data: CaptionData, image_ids: list[int], method: str,
                 batch_size: int, **settings: Any) -> dict[int, list[list[str]]]:
    """Every caption decoder ``method`` gives each image (its words), on the model's device.
    Decoders get ``settings`` and the batch's pooled features (``pooled=``; most ignore it)."""
    sets: dict[int, list[list[str]]] = {}
    decode = DECODERS.get(method, where="decode.method")
    for ids, tokens in decoding.decode_split(model, data.features_of, image_ids,
                                             lambda m, ctx, **batch: decode(m, ctx, **settings, **batch), batch_size,
                                             desc=method, pass_pooled=True):
        n = tokens.shape[1]
        words = data.decode(tokens.reshape(-1, tokens.shape[-1]))
        sets.update((i, words[k * n:(k + 1) * n]) for k, i in enumerate(ids))
    return sets


def decoded_captions(model: CaptionModel, data: CaptionData, image_ids: list[int], method: str,
                     batch_size: int, **settings: Any) -> dict[int, str]:
    """The caption of every image by decoder ``method`` (``decode.method``), on the model's device."""
    sets = decoded_sets(model, data, image_ids, method, batch_size, **settings)
    return {i: " ".join(caps[0]) for i, caps in sets.items()}


def diversity_sets(model: CaptionModel, data: CaptionData, image_ids: list[int], settings: EvalSettings,
                   bs: dict[int, list[list[str]]] | None = None) -> dict[str, dict[int, list[list[str]]]]:
    """Paper 002's two caption sets per image: ``samples`` random samples (rs, seeded from
    ``seed``, so reruns agree) and the top ``beams`` beams (bs; ``bs`` when the evaluation's own
    beam search gave them already), on the model's device."""
    div, batch_size, max_length = settings.diversity, settings.batch_size, settings.max_length
    torch.manual_seed(settings.seed)
    rs = decoded_sets(model, data, image_ids, "sample", batch_size, n=div.samples, max_length=max_length)
    if bs is None:
        bs = decoded_sets(model, data, image_ids, "top_k_beams", batch_size, beam_size=div.beams,
                          n=div.beams, max_length=max_length)
    return {"rs": rs, "bs": bs}


def shares_the_beams(settings: EvalSettings, decode: dict[str, Any]) -> bool:
    """Whether the diversity's bs set is the evaluation's own beam search (same width and length):
    its best beam is then the evaluated caption, and one search gives both."""
    plain = all(decode.get(key, off) == off for key, off in decode_options.OFF.items())  # diverse beams differ
    return (decode["method"] == "beam" and decode["beam_size"] == settings.diversity.beams
            and decode["max_length"] == settings.max_length and plain)


def diversity_report(model: CaptionModel, data: CaptionData, image_ids: list[int],
                     references: dict[int, list[str]], settings: EvalSettings,
                     sets: dict[str, dict[int, list[list[str]]]] | None = None) -> dict[str, Any]:
    """Paper 002's Table 4 for one model: both caption sets of every image (``sets`` if decoded
    already), their scores (:func:`caprl.evaluation.diversity.set_scores`; CIDEr-D reduced per
    decoding as the paper reports it, :data:`~caprl.evaluation.diversity.TABLE4_PRECISION`,
    recorded in the settings as ``precision``) and a few examples."""
    sets = sets if sets is not None else diversity_sets(model, data, image_ids, settings)
    report: dict[str, Any] = {"settings": {**settings.diversity.as_dict(), "seed": settings.seed,
                                           "precision": dict(TABLE4_PRECISION)}}
    report.update({name: set_scores(captions, references, TABLE4_PRECISION[name]) for name, captions in sets.items()})
    report["examples"] = [{"image_id": i, "references": references[i],
                           **{name: [" ".join(c) for c in captions[i]] for name, captions in sets.items()}}
                          for i in sorted(image_ids)[: settings.diversity.examples]]
    for name in sets:
        log.info("diversity (%s): %s", name, ", ".join(f"{k} {v:.4f}" for k, v in report[name].items()))
    return report


def main(args: argparse.Namespace) -> None:
    params = params_mod.load(args.params)
    settings = EvalSettings.from_params(params)  # every setting this job reads, resolved once
    torch.set_num_threads(settings.num_threads)
    captured.set_enabled(settings.cuda_graphs)  # greedy and beam decodes replayed on a GPU
    data = CaptionData.from_args(args, Loading.from_params(params))
    ckpt = checkpoint.load(args.checkpoint, vocab_sha256=data.vocab.sha256)
    check_checkpoint(ckpt.run, args.run, args.dataset, args.checkpoint)
    val = validation.section(ckpt.position, args.checkpoint)  # refuses a history without its best epoch
    provenance.check_model_inputs(args.checkpoint, ckpt.made_from, args.features, data.features.attrs,
                                  args.annotations, data.annotations)
    model = checkpoint.model_from_checkpoint(ckpt).to(default_device())
    split = settings.split
    references = load_references(args.refs)
    made_from = (io.read_json(args.refs, "references file").get("info") or {}).get("made_from") or {}
    provenance.check(args.refs, made_from, args.annotations, data.annotations, "`caprl references`")
    ids = data.split_ids(split)
    missing = sorted(set(ids) - set(references))
    if missing:
        raise CaprlError(f"{args.refs} has no references for {len(missing)} {split} images (e.g. {missing[:3]}): "
                         "rebuild it with `caprl references` from the same annotations")
    decode = run_decode(params, args.run, ckpt.run)
    run_checks.refuse(decode_options.run_options_problem(params, args.run, decode))  # the plan's words
    key = run_checks.decode_key(params, args.run)  # the params key that sets the run's decoder
    if ckpt.run.get("method"):  # what the plan refuses too (caprl.objectives.run_checks)
        run_checks.refuse(run_checks.decoder_problem(args.run, ckpt.run["method"], decode["method"], key))
    value = value_from_checkpoint(ckpt, where=args.checkpoint)
    value = value.to(default_device()).eval() if value is not None else None
    batch_size = settings.batch_size
    diverse = ckpt.run.get("method") in settings.diversity.methods
    # Every caption set the job scores, decoded first: the bs diversity set is the evaluation's own
    # beam search when the widths match (one search); then one tokenizer call for all of them.
    beams = None
    if diverse and shares_the_beams(settings, decode):
        beams = decoded_sets(model, data, ids, "top_k_beams", batch_size, beam_size=decode["beam_size"],
                             n=decode["beam_size"], max_length=decode["max_length"])
        captions = {i: " ".join(caps[0]) for i, caps in beams.items()}
    else:
        captions = decoded_captions(model, data, ids, decode["method"], batch_size, beam_size=decode["beam_size"],
                                    max_length=decode["max_length"],
                                    **decoder_settings(settings, key, args.run, decode["method"], value),
                                    **option_settings(settings, decode, decode["method"], data, device_of(model)))
    sets = diversity_sets(model, data, ids, settings, bs=beams) if diverse else None
    greedy = None
    if settings.greedy:
        greedy = captions if decode["method"] == "greedy" else decoded_captions(
            model, data, ids, "greedy", batch_size, max_length=settings.max_length,
            **option_settings(settings, decode, "greedy", data, device_of(model)))  # under decode:'s constraints
    ahead = None
    if value is not None and settings.lookahead is not None:
        ahead = captions if decode["method"] == "lookahead" else decoded_captions(
            model, data, ids, "lookahead", batch_size, beam_size=decode["beam_size"],
            max_length=decode["max_length"], **decoder_settings(settings, key, args.run, "lookahead", value))
    ptb_tokenize({"references": [r for i in ids for r in references[i]],
                  "captions": [c for decoded in (captions, greedy, ahead) if decoded for c in decoded.values()],
                  "sets": [" ".join(c) for group in (sets or {}).values() for caps in group.values() for c in caps]})

    info: dict[str, Any] = {**ckpt.run, "run": args.run, "dataset": args.dataset, "decode": decode["method"],
                            "best_epoch": (ckpt.position or {}).get("best_epoch"),
                            "beam_size": decode["beam_size"], "code_version": ckpt.code_version,
                            "made_from": ckpt.made_from}  # what its model learnt from (caprl.io.provenance)
    extra: dict[str, Any] = {validation.SECTION: val,  # the checkpoint's own epoch: its point on validation
                             "warnings": degenerate.check(captions, args.run, split),  # collapsed outputs
                             "vocabulary": caption_stats(captions, training_captions(data.annotations)),
                             FAILURE_MODES: failure_modes(captions)}  # bad endings, repeats, length
    if args.start:
        start = checkpoint.load(args.start, vocab_sha256=data.vocab.sha256)
        provenance.check_model_inputs(args.start, start.made_from, args.features, data.features.attrs,
                                      args.annotations, data.annotations)  # the same data as the run's
        start_model = checkpoint.model_from_checkpoint(start).to(default_device())
        extra[FAILURE_MODES].update(kl_to_start=kl_to_start(model, start_model, data, captions, batch_size, args.start),
                                    **start_section(start, args.start))
    if sets is not None:
        extra["diversity"] = diversity_report(model, data, ids, references, settings, sets)
    if greedy is not None:
        extra["greedy"] = greedy_report(model, data, ids, references, settings, greedy)
    if ahead is not None:
        extra["lookahead"] = lookahead_report(model, value, data, ids, references, settings, decode, ahead)
    clip = clip_score_report(params, args.dataset, data, EmbeddingInputs.from_args(args), captions,
                             data.references(split), default_device())  # CLIP-S, RefCLIP-S (Hessel et al. 2021)
    if clip is not None:
        extra[CLIP_SCORE] = clip
    score_and_record(params, args.run, info, captions, references, args.out_captions, args.out_scores,
                     args.out_examples, extra=extra, train_run_id=ckpt.mlflow_run_id)


def check_checkpoint(record: dict[str, Any], run: str, dataset: str, where: str) -> None:
    """Refuse a checkpoint whose run record names another run or dataset than the job's ``--run`` /
    ``--dataset`` (its score file, validation numbers included, would be filed under the wrong run).
    A record without a name or dataset (a checkpoint not written by ``caprl train``) is not checked."""
    for key, flag, want in (("name", "--run", run), ("dataset", "--dataset", dataset)):
        if record.get(key) not in (None, want):
            raise CaprlError(f"{where}: a checkpoint of {'run' if key == 'name' else 'dataset'} '{record[key]}', "
                             f"not of {flag} {want}")


def greedy_report(model: CaptionModel, data: CaptionData, image_ids: list[int], references: dict[int, list[str]],
                  settings: EvalSettings, captions: dict[int, str] | None = None) -> dict[str, Any]:
    """The official CIDEr-D of the greedy captions of ``image_ids`` (``captions`` if the main
    decoding is greedy already), the decoding best-epoch selection validates with."""
    if captions is None:
        captions = decoded_captions(model, data, image_ids, "greedy", settings.batch_size,
                                    max_length=settings.max_length)
    sets = {i: [captions[i].split()] for i in image_ids}
    cider = float(sum(float(s[0]) for s in official_cider_d(sets, references)) / max(1, len(sets)))
    log.info("greedy: CIDEr-D %.4f", cider)
    return {"metrics": {"CIDEr-D": cider}}


def run_decode(params: dict[str, Any], run: str, record: dict[str, Any]) -> dict[str, Any]:
    """The run's evaluation decoding: ``decode:`` with the run's own ``decode:`` on top (paper
    004's runs: beam 2). A run no longer in params.yaml is decoded with ``decode:``."""
    if run in params["runs"]:
        return params_mod.run_spec(params, run).decode
    log.warning("run %s is not in params.yaml (checkpoint of %s): decoding with decode:", run, record.get("name"))
    return dict(params["decode"])


def option_settings(settings: EvalSettings, decode: dict[str, Any], method: str, data: CaptionData,
                    device: torch.device) -> dict[str, Any]:
    """The ``decode:`` options (:mod:`caprl.decoding.options`) decoder ``method`` reads, with the
    vocabulary (``remove_bad_endings`` names words) and, for sampling, a generator seeded from
    params ``seed`` on the model's device (reruns agree); nothing where every option is off."""
    chosen = decode_options.settings_for(method, decode)
    if all(value == decode_options.OFF[key] for key, value in chosen.items()) and method != "sample":
        return {}
    extra: dict[str, Any] = {"words": data.vocab.idx_to_word}
    if method == "sample":
        extra["generator"] = torch.Generator(device=device).manual_seed(settings.seed)
    return {**chosen, **extra}


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def decoder_settings(settings: EvalSettings, key: str, run: str, method: str,
                     value: ValueNetwork | None) -> dict[str, Any]:
    """What decoder ``method`` needs besides the beam size and length: lookahead's value network
    and ``evaluate.lookahead``'s lam and candidates (a CaprlError naming the run and ``key``, the
    params key that set the decoder, when the checkpoint holds no value network or the section
    is missing); nothing for the others."""
    if method != "lookahead":
        return {}
    if value is None:
        raise CaprlError(f"{key}: lookahead decoding needs a value network, but the checkpoint of run {run} holds "
                         "none (only actor_critic runs have one): decode it with greedy or beam")
    if settings.lookahead is None:
        raise CaprlError(f"{key}: lookahead decoding of run {run} reads lam and candidates from evaluate.lookahead, "
                         "which is not set")
    return {"value": value, "lam": settings.lookahead.lam, "candidates": settings.lookahead.candidates}


def official_scores(settings: EvalSettings, captions: dict[int, str],
                    references: dict[int, list[str]]) -> dict[str, Any]:
    """``{"corpus": {metric: value}, "unavailable": {metric: reason}}``: the official metrics of
    ``evaluate.metrics`` (as :func:`caprl.evaluation.report.score_and_record`), no file written."""
    scorer = shared_scorer(settings.corenlp_dir)  # the job's one METEOR JVM
    return scorer.score(references, dict(captions), metrics=list(settings.metrics), per_image=False)


def lookahead_report(model: CaptionModel, value: ValueNetwork, data: Any, image_ids: list[int],
                     references: dict[int, list[str]], settings: EvalSettings, decode: dict[str, Any],
                     captions: dict[int, str] | None = None) -> dict[str, Any]:
    """Paper 003's lookahead row: the lookahead captions of ``image_ids`` (lam and candidates of
    ``evaluate.lookahead``, the run's beam size; ``captions`` if already decoded) scored with the
    official metrics, and a few examples."""
    if settings.lookahead is None:
        raise CaprlError("evaluate.lookahead is not set: the lookahead row reads its lam and candidates there")
    lam, candidates = settings.lookahead.lam, settings.lookahead.candidates
    if captions is None:
        captions = decoded_captions(model, data, image_ids, "lookahead", settings.batch_size,
                                    beam_size=decode["beam_size"], max_length=decode["max_length"], value=value,
                                    lam=lam, candidates=candidates)
    scored = official_scores(settings, captions, references)
    log.info("lookahead (lambda %g): %s", lam, ", ".join(f"{k} {v:.4f}" for k, v in scored["corpus"].items()))
    return {"lambda": lam, "candidates": candidates, "beam_size": decode["beam_size"], "metrics": scored["corpus"],
            "unavailable": scored.get("unavailable", {}),
            "examples": [{"image_id": i, "caption": captions[i]}
                         for i in sorted(captions)[: settings.n_examples]]}
