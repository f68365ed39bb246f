"""Direct CLIP-based Optimization (DiCO; Moratelli et al., BMVC 2024, arXiv 2408.14547), as the
authors' code runs it (github aimagelab/DiCO, ``trainers/dico_trainer.py``, ``DiCOTrainer``:
``prepare_dico_inputs`` / ``compute_beam_search`` (candidates), ``compute_rank`` (the winner),
``compute_dico_logps`` (sequence log-probabilities), ``weight_quality_distances`` (gamma) and
``dico_loss``; ``beta`` / ``tau``: ``main.py`` ``--dico_beta 0.2`` / ``--dico_tau 300``; k:
``scripts/train_dico_coco.sh`` ``--generation_num_beams 5``).

Each image gets k = ``candidates`` captions, every beam of a beam search of width k run by the
policy being trained (online; no gradient) and scored by ``reward`` (a name under ``rewards:``;
the code's: PAC-S, ``trainer_utils.py`` ``TrainerRewardModel``, w 2.0, the scale tau 300 is set
for). The winner w is the candidate of highest reward (the first, i.e. the likelier beam, on a
tie: ``torch.argmax``); the other k - 1 are losers, weighted by

    gamma_j = softmax_j(tau (r_w - r_j))          (over the losers j only)

so the WORSE a loser, the MORE weight (tau 0: uniform). With sequence log-probabilities
l(y) = sum_t log pi(y_t | y_<t, v) over the caption's words and its end token (no length
normalisation), under the policy (train mode, with gradient) and the frozen reference
(:mod:`caprl.objectives.policy`: the XE start, eval mode), the weighted losers enter ONE DPO
logit, not a weighted sum of per-pair losses:

    z = [l(w) - sum_j gamma_j l(y_j)] - [l_ref(w) - sum_j gamma_j l_ref(y_j)]
    L = -log sigmoid(beta z),   averaged over the images (with DDP over the global batch).

With k = 2 (one loser, gamma = 1) this is DPO (Rafailov et al. 2023, eq. 7) on (winner, loser).
One optimiser update per batch, as the code's ``compute_loss``.

The form (weights on the losers, worse -> heavier, inside one sigmoid) is the code's
``weight_quality_distances`` + ``dico_loss``; the paper's text could not be read here to compare
(only its abstract is stored), so no paper-vs-code variant is offered.

Where caprl departs from the code (no option: the code's choice has no caprl counterpart):
the code's beams are ranked by HF's length-normalised score (``length_penalty`` 1.0) when the k
returned are picked; caprl's :func:`~caprl.decoding.beam_search` ranks by summed log-probability.
The code decodes the candidates with the model in train mode (the HF Trainer's
``model.train()``; dropout on): ``candidate_mode: train``; ``eval`` decodes without dropout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from caprl import decoding
from caprl.data.batch import Batch
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import ObjectiveEnv, Options, one_of, register_objective
from caprl.objectives.policy import (REFERENCE_ROLE, PolicyObjective, caption_logprobs, reference_logprobs,
                                     single_stage)
from caprl.objectives.xe import token_mask
from caprl.registry import Registry

#: candidate_mode: the model's mode (True: train, dropout on) while it beam-searches the candidates
CANDIDATE_MODES: Registry[bool] = Registry("DiCO candidate decoding mode")
CANDIDATE_MODES.add("train", True)  # the authors' code: generate() inside the HF Trainer's train step
CANDIDATE_MODES.add("eval", False)


@dataclass
class DiCOOptions(Options):
    candidates: int  # k: beam width, every beam kept (the code's generation_num_beams 5)
    reward: str  # a name under rewards:
    beta: float  # the DPO logit's scale (main.py --dico_beta 0.2)
    tau: float  # the losers' weights' sharpness, softmax(tau (r_w - r_j)) (main.py --dico_tau 300)
    candidate_mode: str = one_of(lambda: CANDIDATE_MODES)  # train (the code's) | eval

    def check(self, where: str) -> None:
        super().check(where)
        if self.candidates < 2:
            raise CaprlError(f"{where}.candidates: DiCO compares a winner with losers: needs >= 2, "
                             f"got {self.candidates}")
        if self.beta <= 0:
            raise CaprlError(f"{where}.beta: expected a positive number, got {self.beta}")
        if self.tau < 0:
            raise CaprlError(f"{where}.tau: expected a number >= 0 (0: uniform weights), got {self.tau}")


def winners(rewards: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` rewards -> ``[B, K]`` bool, True at each image's first candidate of highest reward."""
    return F.one_hot(rewards.argmax(dim=1), rewards.shape[1]).bool()


def loser_weights(rewards: torch.Tensor, tau: float) -> torch.Tensor:
    """``[B, K]``: gamma_j = softmax over the losers of tau (r_w - r_j); 0 at the winner (and for
    every candidate of an image with a single one: no loser)."""
    won = winners(rewards)
    logits = (tau * (rewards.max(dim=1, keepdim=True).values - rewards)).masked_fill(won, float("-inf"))
    return torch.softmax(logits, dim=1).masked_fill(won, 0.0)


@dataclass
class DiCOTerms:
    """Per image: the DPO logit z and its two halves' implicit rewards (log-ratios, before beta)."""

    logits: torch.Tensor
    chosen: torch.Tensor  # l(w) - l_ref(w)
    rejected: torch.Tensor  # sum_j gamma_j (l(y_j) - l_ref(y_j))


def dico_terms(policy: torch.Tensor, reference: torch.Tensor, rewards: torch.Tensor, tau: float) -> DiCOTerms:
    """``[B, K]`` sequence log-probabilities (policy, reference) and rewards -> the terms of ``z``."""
    won = winners(rewards).to(policy.dtype)
    gamma = loser_weights(rewards, tau).to(policy.dtype)
    chosen = (won * (policy - reference)).sum(1)
    rejected = (gamma * policy).sum(1) - (gamma * reference).sum(1)
    return DiCOTerms(chosen - rejected, chosen, rejected)


@register_objective("dico")
class DiCO(PolicyObjective):
    Options = DiCOOptions
    options: DiCOOptions

    def __init__(self, options: Options, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        single_stage(model, "dico")
        self.hold_reference(model)

    def draw(self, model: CaptionModel, batch: Batch) -> torch.Tensor:
        """``[B * K, T]`` (image-major): every beam of a width-K search, no gradient, the model in
        ``candidate_mode`` (train: eager; eval: replayed from a CUDA graph on a GPU); left in train mode."""
        k, length = self.options.candidates, self.env.max_length
        training = CANDIDATE_MODES.get(self.options.candidate_mode, where="dico.candidate_mode")
        model.train(training)
        try:
            with torch.no_grad():
                ctx = model.encode(batch.pooled, batch.regions)
                search = decoding.beam_search if training else decoding.captured_beams
                tokens, _ = search(model, ctx, k, length)
        finally:
            model.train()
        return tokens.reshape(-1, tokens.shape[-1])

    def sequence_logprobs(self, model: CaptionModel, batch: Batch, tokens: torch.Tensor,
                          reference: bool = False) -> torch.Tensor:
        """``[B, K]``: each candidate's summed log-probability (its words and end token), under the
        policy in train mode with gradient, or (``reference``) the frozen reference without."""
        k = self.options.candidates
        mask = token_mask(tokens)[:, : tokens.shape[1]]
        if reference:
            per_token = reference_logprobs(getattr(self, REFERENCE_ROLE), batch, tokens, k)
        else:
            model.train()
            per_token = caption_logprobs(model, batch, tokens, k)
        return (per_token * mask.to(per_token.dtype)).sum(1).view(-1, k)

    def pair_loss(self, policy: torch.Tensor, reference: torch.Tensor,
                  rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss (mean over the global batch's images) and its metrics from ``[B, K]`` numbers."""
        beta = self.options.beta
        terms = dico_terms(policy, reference, rewards, self.options.tau)
        losses = -F.logsigmoid(beta * terms.logits)
        count = self.env.global_sum(losses.new_tensor(float(losses.shape[0])))

        def mean(x: torch.Tensor) -> float:
            return float(self.env.global_sum(x.detach().sum()) / count)

        stats = {"reward_best": mean(rewards.max(dim=1).values), "reward_mean": mean(rewards.mean(dim=1)),
                 "implicit_chosen": mean(beta * terms.chosen), "implicit_rejected": mean(beta * terms.rejected),
                 "implicit_margin": mean(beta * terms.logits),
                 "implicit_accuracy": mean((terms.logits > 0).to(losses.dtype))}
        return losses.sum() * self.env.world_size / count, stats

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        k = self.options.candidates
        tokens = self.draw(model, batch)
        scores = self.env.reward(self.options.reward)([i for i in batch.image_ids for _ in range(k)],
                                                     self.env.decode_words(tokens))
        reference = self.sequence_logprobs(model, batch, tokens, reference=True)
        policy = self.sequence_logprobs(model, batch, tokens)
        rewards = self.tensor(np.asarray(scores), like=policy).view(-1, k)
        return self.pair_loss(policy, reference, rewards)
