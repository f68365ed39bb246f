"""Discriminative captioning with a speaker and a listener (paper 004, "PSST"; sec. 4-6.5, 7.1).

The speaker is the caption model, the listener a VSE++ embedding (:mod:`caprl.retrieval`).
Every joint method minimises eq. 3,

    lam * l_disc(w, I) + (1 - lam) * l_nat(w),

with l_disc eq. 4 (max-of-hinges, hardest negatives, the listener's margin; each sampled
caption against the batch's images, ``sim [B*n, B]``, the captions of the same image not
being each other's negatives) and l_nat = -CIDEr-D (option ``reward``). l_nat is always
optimised by REINFORCE with the greedy caption's reward as baseline (self-critical, as Luo
et al.'s code does; the paper only says "REINFORCE"), over ``n_samples`` samples per image;
multi-stage models are trained on their last stage (as :mod:`caprl.objectives.scst`). The
methods differ in how l_disc reaches the speaker and whether the listener learns:

* ``luo2018`` (sec. 6.4 item 3): the pre-trained listener is frozen (no optimiser group, eval
  mode). REINFORCE only, on the per-sample reward (1 - lam) CIDEr-D - lam l_disc_i, baselined
  by the same mixture for the greedy caption (its l_disc against the batch of greedy captions).
* ``reinforce_joint`` (item 4, appendix A.2): speaker and listener take turns: even trainer
  steps train the speaker only, odd steps the listener only (lam times the mean l_disc of
  the speaker's samples, drawn without gradient in eval mode: our choice, as at test time).
  The speaker's l_disc term is REINFORCE with reward -l_disc_i(sample) and, as baseline, the
  listener's score of the image's ground-truth caption -l_disc_i(gt) (gt = its first gold
  caption, scored against the batch of gold captions).
* ``st_gumbel``, ``st_multinomial`` (items 2, 5): the listener reads the straight-through
  rows (one-hot forward, the relaxed distribution's gradient backward) of the sampled
  captions; l_disc's gradient reaches the speaker through them and the listener directly.
  ``tau``: the Gumbel-softmax / softmax temperature (paper: 1). The REINFORCE term uses the
  log-probabilities of the sampled words under the model (at tau = 1 the multinomial words
  are samples of exactly that distribution; Gumbel-argmax words are for every tau).
* ``psst_gumbel``, ``psst_multinomial`` (sec. 5, items 1, 6): as ST, but a fraction ``rho`` of
  the captions (exactly round(rho * rows) of the global batch, drawn from a generator seeded
  by (params seed, step)) pass their whole relaxed distributions. Their length (the word the
  listener reads last) is that of the sampled caption: the paper is silent on it.
* ``frozen_speaker`` (Table 3 ablations "Frozen speaker (Luo/MLE)"): the speaker, started from
  a trained run, is frozen; the listener learns from ``n_samples`` samples per image (eval
  mode, no gradient, the trainer's sampling noise) by l_disc alone ("in practice we only
  optimize l_disc", sec. 7.1).

Every method selects its best epoch on the val R@10 of the greedy captions (sec. 6.5).
Eq. 4's margin is written 1 in the paper; we use the ``listener:`` margin (VSE++: 0.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from caprl import decoding
from caprl.decoding import ESTIMATORS, Samples
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, Options, register_objective
from caprl.objectives.listener import ListenerObjective, disc_losses, first_captions, greedy_recall
from caprl.retrieval import caption_lengths


@dataclass
class JointOptions(Options):
    lam: float  # eq. 3: weight of l_disc; 1 - lam on l_nat (paper: 5e-4 .. 1e-2)
    n_samples: int  # samples per image
    reward: str  # l_nat = -reward (a name under `rewards:`; paper: CIDEr)


@dataclass
class TrainedListenerOptions(JointOptions):
    listener_lr: float  # learning rate of the listener's optimiser group


@dataclass
class StraightThroughOptions(TrainedListenerOptions):
    tau: float  # temperature of the relaxed rows (paper: 1)


@dataclass
class PartialOptions(StraightThroughOptions):
    rho: float  # PSST: fraction of the captions passed as whole distributions (paper: 0.25)


@dataclass
class FrozenSpeakerOptions(Options):
    n_samples: int  # samples per image the listener learns from


def speaker_samples(model: CaptionModel, batch: Batch, n: int, max_length: int) -> Samples:
    """``n`` captions per image sampled in eval mode without gradient (with the batch's noise);
    the model's mode is restored after."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        ctx = model.encode(batch.pooled, batch.regions)
        samples = decoding.sample(model, ctx, max_length, n=n, noise=batch.noise)
    model.train(was_training)
    return samples


class Discriminative(ListenerObjective):
    """Eq. 3's joint methods: the speaker at ``lr``, the listener (role ``listener``) at
    ``listener_lr``; l_nat by self-critical REINFORCE; best epoch on the val greedy R@10."""

    Options = JointOptions
    options: Any

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return super().param_groups(model) + [
            {"params": list(self.listener.parameters()), "lr": self.options.listener_lr, "name": "listener"}]

    def validation(self, model: CaptionModel, data: Any) -> dict[str, float]:
        return greedy_recall(self.listener, model, data, self.env.max_length)

    def nat_rewards(self, batch: Batch, greedy: Samples, samples: Samples) -> tuple[np.ndarray, np.ndarray]:
        """The reward (CIDEr-D) of every sample ``[B*n]`` and of every greedy caption ``[B]``."""
        n, reward, ids = self.options.n_samples, self.env.reward(self.options.reward), batch.image_ids
        r_greedy = reward(ids, self.env.decode_words(greedy.last_stage()))
        r_sample = reward([i for i in ids for _ in range(n)], self.env.decode_words(samples.last_stage()))
        return np.asarray(r_sample, dtype=np.float64), np.asarray(r_greedy, dtype=np.float64)

    def reinforce(self, advantage: torch.Tensor, samples: Samples) -> torch.Tensor:
        """REINFORCE surrogate: -mean over the sampled tokens of advantage * log p (last stage)."""
        logprobs = samples.logprobs[:, -1]
        return -self.mean(advantage.detach().to(logprobs.dtype).unsqueeze(1) * logprobs, samples.mask[:, -1])

    def host(self, values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
        """Host rewards as float32 on ``like``'s device (advantages are formed in float32)."""
        return self.tensor(values, like=like.float())


@register_objective("luo2018")
class Luo2018(Discriminative):
    """Luo et al. 2018: a frozen pre-trained listener, the speaker by REINFORCE on the mixed
    reward (1 - lam) CIDEr-D - lam l_disc, baselined by the greedy caption's mixed reward."""

    Options = JointOptions
    options: JointOptions

    def __init__(self, options: JointOptions, env: Any, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        self.listener.eval()

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return Objective.param_groups(self, model)  # the speaker only: the listener is frozen

    def train(self, mode: bool = True) -> "Luo2018":
        super().train(mode)
        self.listener.eval()  # frozen: always in eval mode
        return self

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n, lam = self.options.n_samples, self.options.lam
        greedy, samples = self.greedy_and_samples(model, batch, n)
        r_sample, r_greedy = self.nat_rewards(batch, greedy, samples)
        with torch.no_grad():
            d_sample = disc_losses(self.listener, samples.last_stage(), batch.pooled, n).float()
            d_greedy = disc_losses(self.listener, greedy.last_stage(), batch.pooled, 1).float()
        mix_sample = (1 - lam) * self.host(r_sample, like=d_sample) - lam * d_sample
        mix_greedy = (1 - lam) * self.host(r_greedy, like=d_greedy) - lam * d_greedy
        loss = self.reinforce(mix_sample - mix_greedy.repeat_interleave(n), samples)
        return loss, {"reward_sample": float(r_sample.mean()), "reward_greedy": float(r_greedy.mean()),
                      "l_disc": float(d_sample.mean()), "l_disc_greedy": float(d_greedy.mean()),
                      "mix_sample": float(mix_sample.mean()), "mix_greedy": float(mix_greedy.mean())}


@register_objective("reinforce_joint")
class ReinforceJoint(Discriminative):
    """Speaker and listener trained alternately (even steps: speaker, odd steps: listener);
    the speaker's l_disc by REINFORCE with the gold caption's listener score as baseline."""

    Options = TrainedListenerOptions
    options: TrainedListenerOptions

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        if batch.noise is None:
            raise CaprlError("reinforce_joint alternates on the trainer's step: the batch needs its noise "
                             "(caprl.decoding.Noise with the step)")
        if batch.noise.step % 2:
            return self.listener_loss(model, batch)
        return self.speaker_loss(model, batch)

    def speaker_loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """lam * REINFORCE(-l_disc, baseline -l_disc(gt)) + (1 - lam) * REINFORCE(CIDEr-D, greedy)."""
        n, lam = self.options.n_samples, self.options.lam
        greedy, samples = self.greedy_and_samples(model, batch, n)
        r_sample, r_greedy = self.nat_rewards(batch, greedy, samples)
        with torch.no_grad():  # no listener gradient on the speaker's steps
            d_sample = disc_losses(self.listener, samples.last_stage(), batch.pooled, n).float()
            d_gold = disc_losses(self.listener, first_captions(batch), batch.pooled, 1).float()
        advantage_disc = d_gold.repeat_interleave(n) - d_sample  # (-l_disc(w)) - (-l_disc(gt))
        advantage_nat = self.host(r_sample - np.repeat(r_greedy, n), like=d_sample)
        loss = self.reinforce(lam * advantage_disc + (1 - lam) * advantage_nat, samples)
        return loss, {"reward_sample": float(r_sample.mean()), "reward_greedy": float(r_greedy.mean()),
                      "l_disc": float(d_sample.mean()), "l_disc_gt": float(d_gold.mean())}

    def listener_loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """lam * mean l_disc of the speaker's samples (token ids), no speaker gradient."""
        n = self.options.n_samples
        samples = speaker_samples(model, batch, n, self.env.max_length)
        l_disc = self.caption_mean(disc_losses(self.listener, samples.last_stage(), batch.pooled, n))
        return self.options.lam * l_disc, {"l_disc": float(l_disc.detach())}


class StraightThrough(Discriminative):
    """ST estimators (``estimator``: a name in :data:`caprl.decoding.ESTIMATORS`): the listener
    reads the sampled captions' straight-through rows; l_disc trains both networks through them,
    l_nat is self-critical REINFORCE on the same samples."""

    Options = StraightThroughOptions
    options: StraightThroughOptions
    estimator: str = ""

    def relaxed(self, rows: int, batch: Batch, device: torch.device) -> torch.Tensor | None:
        """``[rows]`` True for the captions passed as whole distributions (none: plain ST)."""
        return None

    def decode(self, model: CaptionModel, batch: Batch) -> tuple[Samples, Samples]:
        """The greedy captions (eval mode, no gradient) and ``n_samples`` relaxed samples per
        image (train mode, differentiable, ``Samples.soft`` filled), from one encoding."""
        n = self.options.n_samples
        ctx = model.encode(batch.pooled, batch.regions)
        model.eval()
        with torch.no_grad():
            greedy = decoding.sample(model, ctx, self.env.max_length, greedy=True)
        model.train()
        rows = len(batch.image_ids) * n
        estimator = ESTIMATORS[self.estimator](self.options.tau)
        samples = decoding.sample(model, ctx, self.env.max_length, n=n, estimator=estimator,
                                  relaxed=self.relaxed(rows, batch, batch.pooled.device))
        return greedy, samples

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n, lam = self.options.n_samples, self.options.lam
        greedy, samples = self.decode(model, batch)
        assert samples.soft is not None
        tokens = samples.last_stage()
        d_sample = disc_losses(self.listener, samples.soft[:, -1], batch.pooled, n, lengths=caption_lengths(tokens))
        l_disc = self.caption_mean(d_sample)
        r_sample, r_greedy = self.nat_rewards(batch, greedy, samples)
        l_nat = self.reinforce(self.host(r_sample - np.repeat(r_greedy, n), like=d_sample), samples)
        loss = lam * l_disc + (1 - lam) * l_nat
        return loss, {"reward_sample": float(r_sample.mean()), "reward_greedy": float(r_greedy.mean()),
                      "l_disc": float(l_disc.detach()), "l_nat": float(l_nat.detach())}


class PartialStraightThrough(StraightThrough):
    """PSST (sec. 5): a seeded fraction ``rho`` of the captions passes whole distributions."""

    Options = PartialOptions
    options: PartialOptions

    def relaxed(self, rows: int, batch: Batch, device: torch.device) -> torch.Tensor | None:
        """Drawn for the GLOBAL batch from a generator seeded by (params seed, trainer step) and
        sliced to this process's rows, so a DDP run relaxes the captions one process would."""
        noise = batch.noise
        step = noise.step if noise is not None else 0
        generator = torch.Generator().manual_seed(hash((int(self.env.extras.get("seed", 0)), step)) % (2**63))
        if noise is None:
            return decoding.partial_mask(rows, self.options.rho, generator, device)
        per_image = rows // len(batch.image_ids)
        every = decoding.partial_mask(noise.total * per_image, self.options.rho, generator, device)
        return every[noise.offset * per_image : noise.offset * per_image + rows]


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


@register_objective("frozen_speaker")
class FrozenSpeaker(ListenerObjective):
    """Table 3's "Frozen speaker": only the listener learns (at ``lr``), on the frozen speaker's
    samples, by l_disc alone. The caption model has no optimiser group."""

    Options = FrozenSpeakerOptions
    options: FrozenSpeakerOptions

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return [{"params": list(self.listener.parameters()), "lr": self.options.lr, "name": "listener"}]

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n = self.options.n_samples
        samples = speaker_samples(model, batch, n, self.env.max_length)
        model.eval()  # frozen: left in eval mode
        loss = self.caption_mean(disc_losses(self.listener, samples.last_stage(), batch.pooled, n))
        return loss, {"l_disc": float(loss.detach())}

    def validation(self, model: CaptionModel, data: Any) -> dict[str, float]:
        return greedy_recall(self.listener, model, data, self.env.max_length)
