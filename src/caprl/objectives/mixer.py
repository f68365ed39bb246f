"""MIXER (Ranzato et al., ICLR 2016, "Sequence level training with recurrent neural networks",
Algorithm 1): cross-entropy on the first M words, REINFORCE on the rest, M annealed to 0.

PG-SPIDEr's comparison baseline (paper 001: "evaluate the first M words with MLE and the next
words with REINFORCE. They gradually decrease M during training until it reaches 0"). For
every gold caption of the batch (as ``xe``, one row per caption):

* positions t < M are teacher-forced and trained by cross-entropy on the gold words (a caption
  of at most M words is XE entirely, its end token included, so M >= every caption's length
  is ``xe``'s loss);
* from position M on, the model samples its own words (``n_samples`` continuations per
  caption) from the teacher-forced state after the M gold words (:func:`caprl.decoding.rollout`
  from that :class:`~caprl.decoding.DecodeState`), up to ``max_length`` words in all; each
  sampled token t gets REINFORCE's -(r - b_t) log p(w_t), r = the ``reward`` of the whole
  caption (gold prefix + continuation) against the image's references;
* the baseline b_t is a learned regressor on the RNN hidden state that produced p(w_t)
  (Ranzato: linear, ``baseline_hidden: 0``; :func:`caprl.objectives.pg_spider.baseline_network`),
  trained by MSE towards r, detached from the RNN (no gradient into it), with its own rate.

M is a pure function of the epoch, so a resumed run continues the schedule exactly: the XE
warm start is the ``init`` run (Algorithm 1's first N^XENT epochs), then M = ``m_start`` for
``epochs_per_stage`` epochs, then ``m_start - m_step`` and so on, floored at 0 (paper 001;
Algorithm 1 steps s = T, T - Delta, ..., its Fig. 4 caption ends at s = 1). The epoch comes
from the trainer's step (``batch.noise.step // env.extras["steps_per_epoch"]``).

Where the papers are silent, our choices: the loss is the sum of the XE terms and of the
REINFORCE terms (a caption's ``n_samples`` continuations weigh 1/n each) over the tokens of
the global batch divided by their count, so M >= length is exactly ``xe`` and M = 0 exactly
REINFORCE from the start token with the learned baseline, per token as SCST here; the
baseline's MSE is averaged over the sampled tokens and added. Sampling uses the step's
seeded noise over the caption rows of the global batch (the same captions whatever the
number of processes). Multi-stage models are trained on their last stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from caprl import decoding
from caprl.decoding import DecodeState, Noise, Samples
from caprl.models.base import CaptionModel, map_batch
from caprl.objectives.base import Batch, Objective, ObjectiveEnv, Options, register_objective
from caprl.objectives.pg_spider import baseline_network
from caprl.objectives.xe import gold_targets


@dataclass
class MixerOptions(Options):
    reward: str  # a name under `rewards:`: the whole caption's reward
    n_samples: int  # continuations sampled per gold caption (Ranzato: 1)
    m_start: int  # M (gold words trained by XE) in the first stage (Ranzato: T, the maximum length)
    m_step: int  # words M loses per stage (Ranzato's Delta)
    epochs_per_stage: int  # epochs per value of M (Ranzato's N^{XE+R})
    baseline_lr: float  # learning rate of the baseline regressor
    baseline_hidden: int  # its hidden units (0: linear, Ranzato)


def schedule(epoch: int, m_start: int, m_step: int, epochs_per_stage: int) -> int:
    """M at ``epoch`` (0-based): ``m_start`` less ``m_step`` per completed stage, at least 0."""
    return max(0, m_start - m_step * (epoch // epochs_per_stage))


def xe_mask(labels: torch.Tensor, m: int, positions: int) -> torch.Tensor:
    """``[R, positions]``: 1 where a gold token is trained by XE: positions t < m of the caption
    (words, then the end token at position L), or all of it (t <= L) when L <= m."""
    lengths = (labels > 0).sum(dim=1, keepdim=True)
    t = torch.arange(positions, device=labels.device).unsqueeze(0)
    return ((t <= lengths) & ((lengths <= m) | (t < m))).float()


def continues(labels: torch.Tensor, m: int) -> torch.Tensor:
    """``[R]`` bool: the captions longer than m words (their words from position m on are sampled)."""
    return (labels > 0).sum(dim=1) > m


@dataclass
class MixedDecode:
    """One MIXER pass over the gold captions ``[R, T]``: the log-probabilities ``[R, P]`` of the
    gold tokens at positions 0..P-1 and which are trained by XE; the continuations (rows
    caption-major: ``n`` per caption, ``[R * n, ...]``; None when M leaves nothing to sample),
    which of their rows continue a caption (``live [R * n]``) and those rows' whole captions
    (gold prefix + continuation, words) for the reward."""

    gold_logprobs: torch.Tensor
    gold_mask: torch.Tensor
    samples: Samples | None
    live: torch.Tensor | None
    captions: list[list[str]]
    m: int


@register_objective("mixer")
class Mixer(Objective):
    holds = ("baseline",)
    Options = MixerOptions
    options: MixerOptions

    def __init__(self, options: MixerOptions, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        self.baseline = baseline_network(model.config.hidden_size, options.baseline_hidden)

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return super().param_groups(model) + [
            {"params": list(self.baseline.parameters()), "lr": self.options.baseline_lr, "name": "baseline"}]

    def m_at(self, batch: Batch) -> int:
        """M for this batch's training step (from the trainer's step and the steps of an epoch)."""
        step = batch.noise.step if batch.noise is not None else 0
        epoch = step // max(1, int(self.env.extras.get("steps_per_epoch", 1)))
        o = self.options
        return schedule(epoch, o.m_start, o.m_step, o.epochs_per_stage)

    def caption_noise(self, batch: Batch) -> Noise | None:
        """The step's noise over the caption rows of the GLOBAL batch: this process's first row is
        the number of captions of the images before its block (summed over processes)."""
        noise = batch.noise
        if noise is None:
            return None
        counts = torch.bincount(batch.label_image, minlength=len(batch.image_ids))
        everyone = counts.new_zeros(noise.total)
        everyone[noise.offset:noise.offset + len(batch.image_ids)] = counts
        everyone = self.env.global_sum(everyone).cpu()
        return Noise(noise.seed, noise.step, total=int(everyone.sum()), offset=int(everyone[:noise.offset].sum()),
                     calls=noise.calls)

    def decode(self, model: CaptionModel, batch: Batch, m: int) -> MixedDecode:
        """Teacher forcing over the first positions, then ``n_samples`` continuations of every
        caption longer than ``m`` words from the state after its ``m`` gold words."""
        n, labels = self.options.n_samples, batch.labels
        rows, length = labels.shape
        ctx = map_batch(lambda t: t.index_select(0, batch.label_image), model.encode(batch.pooled, batch.regions))
        gold = gold_targets(labels)  # [R, T+1]: the words, then the end token
        state, prev = model.init_state(ctx), labels.new_zeros(rows, model.n_stages)
        logprobs, after_m = [], None
        for t in range(min(m, length) + 1):
            if t == m:
                after_m = (state, prev)
            out = model.step(prev, ctx, state)
            logprobs.append(out.logprobs[:, -1].gather(-1, gold[:, t, None]).squeeze(-1))
            state, prev = out.state, gold[:, t, None].expand(rows, model.n_stages)
        gold_logprobs = torch.stack(logprobs, dim=1)
        mask = xe_mask(labels, m, gold_logprobs.shape[1])
        steps = self.env.max_length - m
        if after_m is None or steps <= 0:  # the same on every process (T is the vocabulary's max length)
            return MixedDecode(gold_logprobs, mask, None, None, [], m)
        expand = lambda x: x.repeat_interleave(n, dim=0)  # noqa: E731
        live = expand(continues(labels, m))  # the other rows are finished: they emit 0 at no cost
        at = DecodeState(map_batch(expand, ctx), map_batch(expand, after_m[0]), expand(after_m[1]),
                         (~live).unsqueeze(1).expand(-1, model.n_stages).clone(), t=m)
        noise = self.caption_noise(batch)
        samples = decoding.rollout(model, at, steps, noise=noise, per_image=n, keep_hidden=True)
        if noise is not None:
            batch.noise.calls = noise.calls
        tokens = torch.cat([expand(labels[:, :m]), samples.last_stage()], dim=1)[live]
        return MixedDecode(gold_logprobs, mask, samples, live, self.env.decode_words(tokens), m)

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        return self.mixed_loss(self.decode(model, batch, self.m_at(batch)), batch)

    def mixed_loss(self, mixed: MixedDecode, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """XE on the gold positions, REINFORCE with the baseline on the sampled ones, plus the
        baseline's MSE; one mean over the tokens of the global batch (see the module docstring)."""
        nll, xe_mask_ = -mixed.gold_logprobs, mixed.gold_mask
        stats = {"mixer_m": float(mixed.m), "xe": float(self.mean(nll, xe_mask_).detach())}
        if mixed.samples is None:
            return self.mean(nll, xe_mask_), stats
        n, samples, live = self.options.n_samples, mixed.samples, mixed.live
        assert samples.hidden is not None and live is not None
        owners = batch.label_image.repeat_interleave(n)[live].tolist()
        reward = torch.zeros(live.shape[0], dtype=samples.logprobs.dtype, device=samples.logprobs.device)
        if mixed.captions:
            scored = self.env.reward(self.options.reward)([batch.image_ids[i] for i in owners], mixed.captions)
            reward[live] = self.tensor(np.asarray(scored), like=reward)
        steps = samples.hidden.shape[2]  # the steps decoded (on CPU it stops when every row has ended)
        logprobs, mask = samples.logprobs[:, -1, :steps], samples.mask[:, -1, :steps]
        b = self.baseline(samples.hidden[:, -1].detach()).squeeze(-1)  # [R * n, steps]: no gradient into the RNN
        reinforce = -(reward.unsqueeze(1) - b).detach() * logprobs
        policy = self.mean(torch.cat([nll.flatten(), reinforce.flatten()]),
                           torch.cat([xe_mask_.flatten(), mask.flatten() / n]))
        mse = self.mean((reward.unsqueeze(1) - b) ** 2, mask)
        stats.update({"reinforce": float(self.mean(reinforce, mask).detach()), "baseline_mse": float(mse.detach()),
                      "reward_sample": float(self.mean(reward, live.to(reward.dtype)).detach())})
        return policy + mse, stats
