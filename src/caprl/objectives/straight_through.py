"""Straight-through joint training of paper 004 (sec. 4.2 and 5; sec. 6.4 items 1, 2, 5, 6):
the listener reads relaxed rows of the speaker's captions, and l_disc (eq. 4, a caption mean)
trains both networks through them; l_nat is self-critical REINFORCE (a caption mean:
:meth:`caprl.objectives.discriminative.Discriminative.reinforce`). ``tau``: the Gumbel-softmax
/ softmax temperature (paper: 1).

* ``st_gumbel``, ``st_multinomial`` (items 5, 2): every caption passes straight-through rows
  (the sampled one-hot forward, the relaxed distribution's gradient backward) and reads its
  sampled word at the next step, without gradient through it (the authors' code,
  models/AttModel.py:395-399: ``embed(it)`` for the ST rows). l_nat reuses these samples
  (models/AlternatingJointModel.py:491-495): at tau = 1 the multinomial words are samples of
  the policy, and Gumbel-argmax words are for every tau.
* ``psst_gumbel``, ``psst_multinomial`` (sec. 5, items 1, 6): some rows pass their whole
  relaxed distribution (multinomial: the softmax; Gumbel: the Gumbel-softmax sample). Option
  ``variant`` (:data:`PSST_VARIANTS`):

  - ``paper`` (the text, the default): "we pass the full continuous distribution for a
    fraction rho of the samples ... for rho of the samples, the stochastic and discrete units
    are practically replaced by a deterministic and differentiable variable"; "for 1 - rho of
    training images" the listener sees one-hot captions. Exactly round(rho * rows) CAPTIONS
    of the global batch are relaxed (a generator seeded by (params seed, trainer step), the
    same choice on every DDP process), all their words; a relaxed caption feeds its relaxed
    word forward (``soft @ W``, :data:`caprl.decoding.FEEDS` ``relaxed``), so it is a
    deterministic (multinomial), differentiable function of the image, and its length is
    where the argmax of its rows is the end token (the paper is silent on the length; the
    argmax keeps it deterministic; for Gumbel it is the sampled word). The other captions are
    ST captions reading their sampled words.
  - ``code`` (the authors' code, models/multinomial_soft.py:24-33, models/gumbel_softmax.py:31-38,
    models/AttModel.py:395-399): each TOKEN is relaxed with probability rho, redrawn at every
    step (their ``--prob_multinomial_soft`` is the probability of a HARD token: rho = 1 -
    prob); every row feeds forward the row it passes on (``soft_vec @ W``: the relaxed
    distribution or the straight-through one-hot, feed ``straight_through``); the sampled word
    decides the end. The mask is drawn for the global batch from the same seeded generator.

  l_nat is REINFORCE on a FRESH sample of the policy (relaxed trajectories are not samples of
  it), as the authors' code does for PSST (models/AlternatingJointModel.py:491-495).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from caprl import decoding
from caprl.decoding import ESTIMATORS, Samples
from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, ObjectiveEnv, one_of, register_objective
from caprl.objectives.baselines import BASELINES
from caprl.objectives.discriminative import Discriminative, TrainedListenerOptions
from caprl.objectives.listener import disc_losses
from caprl.registry import Registry
from caprl.retrieval import caption_lengths


@dataclass
class StraightThroughOptions(TrainedListenerOptions):
    tau: float  # temperature of the relaxed rows (paper: 1)


@dataclass
class PartialOptions(StraightThroughOptions):
    rho: float  # PSST: fraction of the captions (paper) / tokens (code) relaxed (paper: 0.25)
    #: a name in PSST_VARIANTS: paper (the text) or code (the authors' code)
    variant: str = one_of(lambda: PSST_VARIANTS)


# (rows, steps, rho, generator, device) -> the relaxed mask: [rows] per caption or [rows, steps] per token
MaskFn = Callable[[int, int, float, torch.Generator, torch.device], torch.Tensor]


@dataclass(frozen=True)
class PartialVariant:
    """What a PSST variant relaxes (``mask``) and what each row reads next (``feed``)."""

    mask: MaskFn
    feed: str


PSST_VARIANTS: Registry[PartialVariant] = Registry("PSST variant")
PSST_VARIANTS.add("paper", PartialVariant(
    mask=lambda rows, steps, rho, generator, device: decoding.partial_mask(rows, rho, generator, device),
    feed="relaxed"))
PSST_VARIANTS.add("code", PartialVariant(mask=decoding.partial_token_mask, feed="straight_through"))


class StraightThrough(Discriminative):
    """ST estimators (``estimator``: a name in :data:`caprl.decoding.ESTIMATORS`): the listener
    reads the captions' straight-through rows; l_disc trains both networks through them,
    l_nat is self-critical REINFORCE."""

    Options = StraightThroughOptions
    options: StraightThroughOptions
    estimator: str = ""

    def relaxed(self, rows: int, batch: Batch, device: torch.device) -> torch.Tensor | None:
        """The rows passed as whole distributions (None: plain ST)."""
        return None

    def feed(self) -> str:
        """What each row reads at the next step (a name in :data:`caprl.decoding.FEEDS`)."""
        return "word"

    def nat_samples(self, model: CaptionModel, ctx: Any, batch: Batch, samples: Samples) -> Samples:
        """The samples l_nat's REINFORCE is computed on: ST reuses its own."""
        return samples

    def decode(self, model: CaptionModel, batch: Batch) -> tuple[Samples | None, Samples, Samples]:
        """From one train-mode encoding: ``n_samples`` relaxed samples per image (train mode,
        differentiable, ``Samples.soft`` filled) and the samples for l_nat (:meth:`nat_samples`);
        then the greedy captions (:meth:`~caprl.objectives.base.Objective.greedy_captions`, no
        gradient, option ``greedy_mode``; None if l_nat's baseline does not read them)."""
        n = self.options.n_samples
        model.train()
        ctx = model.encode(batch.pooled, batch.regions)
        rows = len(batch.image_ids) * n
        estimator = ESTIMATORS[self.estimator](self.options.tau)
        samples = decoding.sample(model, ctx, self.env.max_length, n=n, estimator=estimator,
                                  relaxed=self.relaxed(rows, batch, batch.pooled.device), feed=self.feed())
        nat = self.nat_samples(model, ctx, batch, samples)
        greedy = self.greedy_captions(model, batch, ctx) if BASELINES[self.options.baseline].greedy else None
        return greedy, samples, nat

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n, lam = self.options.n_samples, self.options.lam
        greedy, samples, nat = self.decode(model, batch)
        assert samples.soft is not None
        tokens = samples.last_stage()
        d_sample = disc_losses(self.listener, samples.soft[:, -1], batch.pooled, n, lengths=caption_lengths(tokens))
        l_disc = self.caption_mean(d_sample)
        r_sample, r_greedy = self.nat_rewards(batch, greedy, nat)
        advantage = BASELINES[self.options.baseline].advantage(r_sample, r_greedy, n)
        l_nat = self.reinforce(self.host(advantage, like=d_sample), nat)
        loss = lam * l_disc + (1 - lam) * l_nat
        return loss, {**self.nat_stats(r_sample, r_greedy),
                      "l_disc": float(l_disc.detach()), "l_nat": float(l_nat.detach())}


class PartialStraightThrough(StraightThrough):
    """PSST (sec. 5): a seeded fraction ``rho`` of the captions (``variant: paper``) or of the
    tokens (``variant: code``) passes whole distributions; l_nat on a fresh sample."""

    Options = PartialOptions
    options: PartialOptions

    def __init__(self, options: PartialOptions, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        self.variant = PSST_VARIANTS.get(options.variant, where=f"{self.name}.variant")

    def feed(self) -> str:
        return self.variant.feed

    def relaxed(self, rows: int, batch: Batch, device: torch.device) -> torch.Tensor | None:
        """Drawn for the GLOBAL batch from a generator seeded by (params seed, trainer step) and
        sliced to this process's rows, so a DDP run relaxes what one process would."""
        noise, steps = batch.noise, self.env.max_length
        step = noise.step if noise is not None else 0
        generator = torch.Generator().manual_seed(hash((int(self.env.extras.get("seed", 0)), step)) % (2**63))
        if noise is None:
            return self.variant.mask(rows, steps, self.options.rho, generator, device)
        per_image = rows // len(batch.image_ids)
        every = self.variant.mask(noise.total * per_image, steps, self.options.rho, generator, device)
        return every[noise.offset * per_image : noise.offset * per_image + rows]

    def nat_samples(self, model: CaptionModel, ctx: Any, batch: Batch, samples: Samples) -> Samples:
        """A fresh sample of the policy (train mode, the batch's noise): relaxed captions are not
        samples of it (models/AlternatingJointModel.py:491-495)."""
        return decoding.sample(model, ctx, self.env.max_length, n=self.options.n_samples, noise=batch.noise)


@register_objective("st_gumbel")
class STGumbel(StraightThrough):
    estimator = "st_gumbel"


@register_objective("st_multinomial")
class STMultinomial(StraightThrough):
    estimator = "st_multinomial"


@register_objective("psst_gumbel")
class PSSTGumbel(PartialStraightThrough):
    estimator = "st_gumbel"


@register_objective("psst_multinomial")
class PSSTMultinomial(PartialStraightThrough):
    estimator = "st_multinomial"
