"""Discriminative captioning with a speaker and a listener (paper 004, "PSST"; sec. 4-6.5, 7.1).

The speaker is the caption model, the listener a VSE++ embedding (:mod:`caprl.retrieval`).
Every joint method minimises eq. 3,

    lam * l_disc(w, I) + (1 - lam) * l_nat(w),

with l_disc eq. 4 (max-of-hinges, hardest negatives, the listener's margin; each sampled
caption against the batch's images, ``sim [B*n, B]``, the captions of the same image not
being each other's negatives) and l_nat = -CIDEr-D (option ``reward``). l_nat is always
optimised by REINFORCE with the greedy caption's reward as baseline (self-critical, as Luo
et al.'s code does; the paper only says "REINFORCE"), over ``n_samples`` samples per image;
multi-stage models are trained on their last stage (as :mod:`caprl.objectives.scst`). Option
``baseline`` (:data:`caprl.objectives.baselines.BASELINES`) can replace that greedy baseline
(``nsc``: the mean of the image's other samples, no greedy decode; luo2018: of their mixed reward).
The greedy captions are decoded as option ``greedy_mode`` says; params.yaml's ``train`` (dropout on)
is the authors' code's: models/AlternatingJointModel.py ``greedy_baseline`` and
``greedy_res_for_cider`` call ``caption_generator.sample`` with no ``.eval()`` (as Luo et al.'s
DiscCaptioning models/JointModel.py ``forward``).

**One meaning of lam.** Both terms are per caption, averaged over the captions of the global
batch (DDP-correct: :meth:`ListenerObjective.caption_mean`): l_disc is the mean of eq. 4, and
every REINFORCE surrogate is ``-mean_i (r_i - b_i) * sum_t log p(w_it)`` (:meth:`reinforce`),
the unbiased gradient of the mean per-caption reward. So lam trades the same two quantities
in every method. The authors' code (vgilad/CooperativeImageCaptioning@1f04bbd) does not:
for ST/PSST it SUMS eq. 4 over the batch of N = 128 captions (models/VSEFCModel.py:197-200,
models/AlternatingJointModel.py:374) while l_nat is a per-TOKEN mean (``traditional_cider``,
models/AlternatingJointModel.py:426), weighted ``lam_a`` and ``1 - lam_a`` (bash_scripts/run_joint.sh:92);
that is our objective at ``lam / (1 - lam) = lam_a * N * Lbar / (1 - lam_a)`` (Lbar: tokens per
caption, ~10 on COCO), e.g. the paper's lam_a 0.01 .. 0.0005 (sec. 6.2, "small because the two
components ... have different scales") ~ our lam 0.93 .. 0.39. For Luo / REINFORCE their two
terms are both per-token means (models/AlternatingJointModel.py:324, 426), so lam = lam_a there. The demo's lam
grid (params.yaml ``sweeps.lam``) is chosen on validation, not taken from the paper.

The methods differ in how l_disc reaches the speaker and whether the listener learns:

* ``luo2018`` (sec. 6.4 item 3): the pre-trained listener is frozen (no optimiser group, eval
  mode). REINFORCE only, on the per-sample reward (1 - lam) CIDEr-D - lam l_disc_i, baselined
  by the same mixture for the greedy caption (its l_disc against the batch of greedy captions).
* ``reinforce_joint`` (item 4, appendix A.2): speaker and listener take turns on every batch
  (:attr:`ReinforceJoint.turns`): the speaker's turn trains the speaker (listener frozen), then
  the listener's turn trains the listener on the updated speaker's samples (speaker frozen).
  The speaker's l_disc term is REINFORCE with reward -l_disc_i(sample) and, as baseline, the
  listener's score of the image's ground-truth caption -l_disc_i(gt) (gt = its first gold
  caption, scored against the batch of gold captions).
* ``st_gumbel``, ``st_multinomial``, ``psst_gumbel``, ``psst_multinomial`` (sec. 4.2, 5, items 1,
  2, 5, 6): the listener reads relaxed rows and l_disc's gradient reaches the speaker through
  them: :mod:`caprl.objectives.straight_through`.
* ``frozen_speaker`` (Table 3 ablations "Frozen speaker (Luo/MLE)"): the speaker, started from
  a trained run, is frozen; the listener learns from ``n_samples`` samples per image (eval
  mode, no gradient, the trainer's sampling noise) by l_disc alone ("in practice we only
  optimize l_disc", sec. 7.1).

Every method selects its best epoch on the val R@10 of the greedy captions (sec. 6.5).
Eq. 4's margin is written 1 in the paper; we use the ``listener:`` margin (VSE++: 0.2).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from caprl import decoding
from caprl.decoding import Samples
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, Options, register_objective
from caprl.objectives.baselines import BASELINES, BaselineOptions
from caprl.objectives.listener import ListenerObjective, disc_losses, first_captions, greedy_recall


@dataclass
class JointOptions(BaselineOptions):  # n_samples, baseline (l_nat's)
    lam: float  # eq. 3: weight of l_disc; 1 - lam on l_nat (both per caption: see the module docstring)
    reward: str  # l_nat = -reward (a name under `rewards:`; paper: CIDEr)


@dataclass
class TrainedListenerOptions(JointOptions):
    listener_lr: float  # learning rate of the listener's optimiser group


@dataclass
class FrozenSpeakerOptions(Options):
    n_samples: int  # samples per image the listener learns from


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode and without gradient for the block; its mode restored after."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was_training)


def speaker_samples(model: CaptionModel, batch: Batch, n: int, max_length: int) -> Samples:
    """``n`` captions per image sampled in eval mode without gradient (with the batch's noise);
    the model's mode is restored after."""
    with frozen(model):
        ctx = model.encode(batch.pooled, batch.regions)
        return decoding.sample(model, ctx, max_length, n=n, noise=batch.noise)


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

    def nat_rewards(self, batch: Batch, greedy: Samples | None,
                    samples: Samples) -> tuple[np.ndarray, np.ndarray | None]:
        """The reward (CIDEr-D) of every sample ``[B*n]`` and of every greedy caption ``[B]``
        (None without greedy captions: a baseline that does not read them)."""
        n, reward, ids = self.options.n_samples, self.env.reward(self.options.reward), batch.image_ids
        r_greedy = None if greedy is None else reward(ids, self.env.decode_words(greedy.last_stage()))
        r_sample = reward([i for i in ids for _ in range(n)], self.env.decode_words(samples.last_stage()))
        return (np.asarray(r_sample, dtype=np.float64),
                None if r_greedy is None else np.asarray(r_greedy, dtype=np.float64))

    def nat_stats(self, r_sample: np.ndarray, r_greedy: np.ndarray | None) -> dict[str, float]:
        """The mean sample reward and, where decoded, the mean greedy reward."""
        greedy = {} if r_greedy is None else {"reward_greedy": float(r_greedy.mean())}
        return {"reward_sample": float(r_sample.mean()), **greedy}

    def reinforce(self, advantage: torch.Tensor, samples: Samples) -> torch.Tensor:
        """REINFORCE surrogate of a per-caption reward: ``-mean_i advantage_i * sum_t log p(w_it)``
        over the captions of the global batch (last stage): its gradient is the unbiased
        estimate of the gradient of the mean per-caption reward, on eq. 4's scale (a caption
        mean) whatever the captions' lengths."""
        logprobs, mask = samples.logprobs[:, -1], samples.mask[:, -1]
        per_caption = (logprobs * mask).sum(dim=-1)
        return -self.caption_mean(advantage.detach().to(per_caption.dtype) * per_caption)

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
        n, lam, baseline = self.options.n_samples, self.options.lam, BASELINES[self.options.baseline]
        greedy, samples = self.greedy_and_samples(model, batch, n, greedy=baseline.greedy)
        r_sample, r_greedy = self.nat_rewards(batch, greedy, samples)
        with torch.no_grad():
            d_sample = disc_losses(self.listener, samples.last_stage(), batch.pooled, n).float()
            d_greedy = (None if greedy is None
                        else disc_losses(self.listener, greedy.last_stage(), batch.pooled, 1).float())
        mix_sample = (1 - lam) * self.host(r_sample, like=d_sample) - lam * d_sample
        mix_greedy = None if d_greedy is None else (1 - lam) * self.host(r_greedy, like=d_greedy) - lam * d_greedy
        loss = self.reinforce(baseline.advantage(mix_sample, mix_greedy, n), samples)
        stats = {**self.nat_stats(r_sample, r_greedy), "l_disc": float(d_sample.mean())}
        if d_greedy is not None:
            stats["l_disc_greedy"] = float(d_greedy.mean())
        stats["mix_sample"] = float(mix_sample.mean())
        if mix_greedy is not None:
            stats["mix_greedy"] = float(mix_greedy.mean())
        return loss, stats


Turn = Callable[[CaptionModel, Batch], tuple[torch.Tensor, dict[str, float]]]


@register_objective("reinforce_joint")
class ReinforceJoint(Discriminative):
    """Speaker and listener trained alternately, one update each per batch; the speaker's
    l_disc by REINFORCE with the gold caption's listener score as baseline.

    The paper (sec. 6.4 item 4): "trained alternately, where at each step one network is frozen
    and the other is being updated"; the authors' code alternates one step at a time with two
    Adam optimisers (train.py:481-487, models/AlternatingJointModel.py:508-551), each turn on a
    batch of its own, so its speaker sees half the batches; here both turns read the same
    batch and the speaker is updated on every batch, as in the other methods.

    Trainer contract (``turns`` / ``turn_loss``): on every batch, for each turn in
    :attr:`turns` in order, the trainer runs one full optimiser step: ``zero_grad``,
    ``loss, metrics = turn_loss(model, batch, turn)``, ``backward``, clip, ``step``; only the
    parameters that got gradients move (the speaker's turn gives the listener none, the
    listener's turn the speaker none). So every batch gives one speaker update, as in every
    other method, and one listener update on samples of the speaker just updated.
    :meth:`loss`, for a trainer without turns, returns the sum of both turns' losses (one
    optimiser step updates both networks; the listener's samples are then drawn before the
    speaker's update).
    """

    Options = TrainedListenerOptions
    options: TrainedListenerOptions
    turns: tuple[str, ...] = ("speaker", "listener")

    def turn_loss(self, model: CaptionModel, batch: Batch, turn: str) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one turn (a name in :attr:`turns`): :meth:`speaker_loss` or :meth:`listener_loss`."""
        by_turn: dict[str, Turn] = {"speaker": self.speaker_loss, "listener": self.listener_loss}
        if turn not in by_turn:
            raise CaprlError(f"reinforce_joint: unknown turn {turn!r}; its turns are {', '.join(self.turns)}")
        return by_turn[turn](model, batch)

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        speaker, speaker_stats = self.speaker_loss(model, batch)
        listener, listener_stats = self.listener_loss(model, batch)
        return speaker + listener, {**speaker_stats, **listener_stats}

    def speaker_loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The speaker's turn, the listener frozen (eval mode, no gradient):
        lam * REINFORCE(-l_disc, baseline -l_disc(gt)) + (1 - lam) * REINFORCE(CIDEr-D, greedy)."""
        n, lam, baseline = self.options.n_samples, self.options.lam, BASELINES[self.options.baseline]
        greedy, samples = self.greedy_and_samples(model, batch, n, greedy=baseline.greedy)
        r_sample, r_greedy = self.nat_rewards(batch, greedy, samples)
        with frozen(self.listener):
            d_sample = disc_losses(self.listener, samples.last_stage(), batch.pooled, n).float()
            d_gold = disc_losses(self.listener, first_captions(batch), batch.pooled, 1).float()
        advantage_disc = d_gold.repeat_interleave(n) - d_sample  # (-l_disc(w)) - (-l_disc(gt))
        advantage_nat = self.host(baseline.advantage(r_sample, r_greedy, n), like=d_sample)
        loss = self.reinforce(lam * advantage_disc + (1 - lam) * advantage_nat, samples)
        return loss, {**self.nat_stats(r_sample, r_greedy),
                      "l_disc": float(d_sample.mean()), "l_disc_gt": float(d_gold.mean())}

    def listener_loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The listener's turn, the speaker frozen: lam * mean l_disc of the speaker's samples
        (token ids, drawn in eval mode without gradient: our choice, as at test time)."""
        n = self.options.n_samples
        samples = speaker_samples(model, batch, n, self.env.max_length)
        l_disc = self.caption_mean(disc_losses(self.listener, samples.last_stage(), batch.pooled, n))
        return self.options.lam * l_disc, {"listener_l_disc": float(l_disc.detach())}


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
