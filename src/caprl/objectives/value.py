"""Paper 003 (Shi et al., "Image captioning based on deep reinforcement learning"): the value
network, the visual-semantic embedding reward, and the value network's pre-training (eq. 9).

Where paper 003 is vague we follow Ren et al. (CVPR 2017, "Deep reinforcement learning-based
image captioning with embedding reward"), which it summarises:

* **The embedding** (paper 003 sec. 3.3.1, eq. 5; Ren et al. sec. 3.3) is the listener of paper
  004 (:class:`caprl.retrieval.Listener`, role ``listener``): ONE embedding model, not two. Ren
  et al. train it with a bidirectional ranking loss with a margin summed over every negative,
  which is :func:`caprl.retrieval.vse_sum_hinge`: a ``listener`` run whose ``warmup_epochs``
  equals its ``epochs`` (the default ``listener`` run switches to VSE++'s hardest negatives after
  its warm-up; params.yaml says how to use Ren et al.'s loss alone). Eq. 5 is garbled in our
  copy of the paper (a hinge between the embeddings of adjacent hidden states); we take Ren et
  al.'s loss.
* **The reward** of a finished caption (eq. 6) is the cosine of its caption embedding and its
  image embedding (the diagonal of ``Listener.similarity``), computed without gradient. Option
  ``cider_weight`` w mixes in a language reward: R = (1 - w) * cosine + w * ``reward`` (a name
  under ``rewards:``, e.g. CIDEr-D); w = 0 is the paper. Eq. 7's combined loss belongs to the
  embedding's training and is not used for the reward.
* **The value network** v(s_t) (sec. 3.2.2, Fig. 3; Ren et al. sec. 3.2): the image's pooled
  feature -> Linear (the "CNN"); a GRU over the partial caption's words with its own word
  embedding (the policy's parameters are not shared); a three-layer MLP on [image projection;
  GRU state] predicting the final reward. s_0 is the image alone (the GRU state is zero), s_t
  the state after the first t words. The paper is silent on the word-embedding and projection
  sizes: both are ``value_hidden`` (sec. 4.1: "all the inputs are set to be 512 dimensions
  including the hidden units"); ``value_mlp`` are the MLP's two hidden sizes (the third layer
  outputs the value). Paper 003 uses LSTMs (sec. 4.1); we use a GRU (one state tensor to
  carry through the beams), as the listener does.
* **Pre-training** (``value``, eq. 9, sec. 3.3.2): the policy (started from an XE run) and the
  embedding are frozen (no optimiser group; the embedding in eval mode); each step samples
  ``n_samples`` captions per image from the policy without gradient and regresses v(s_t) on the
  caption's reward R by mean squared error over every step t at which the policy chose a word
  (the state before each word, the end token's included). The captions are sampled as
  actor-critic samples them (:func:`policy_samples`: the policy in train mode, dropout on, the
  trainer's noise), so the value network is fitted on the states it is used on in
  actor-critic; an eval-mode (dropout off) policy's captions are another distribution.
  Validation: the same MSE on the val images' captions, sampled the same way (train mode) with
  a fixed noise and fixed dropout masks (the RNG seeded, then restored), so epochs compare and
  the training's random streams are untouched; best epoch on -MSE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from caprl import decoding
from caprl.models import checkpoint
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.base import Batch, Objective, ObjectiveEnv, Options, register_objective
from caprl.objectives.listener import VAL_BATCH, build_listener, in_eval_mode
from caprl.retrieval import Listener

VALUE_ROLE = "value"  # the value network's role in checkpoints and in runs' init
ValueState = tuple[torch.Tensor, torch.Tensor]  # (image projection [N, H], GRU state [N, H])


class ValueNetwork(nn.Module):
    """v(s_t): the expected final reward of a partial caption s_t of an image (sec. 3.2.2)."""

    def __init__(self, vocab_size: int, feat_dim: int, hidden: int, mlp: Sequence[int], where: str = "value") -> None:
        super().__init__()
        if len(mlp) != 2:
            raise CaprlError(f"{where}.value_mlp: expected the MLP's two hidden sizes, got {list(mlp)!r}")
        self.sizes = {"value_hidden": int(hidden), "value_mlp": [int(m) for m in mlp]}
        self.where = where  # names the run in load errors
        self.image = nn.Linear(feat_dim, hidden)
        self.words = nn.Embedding(vocab_size, hidden)
        self.rnn = nn.GRUCell(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(2 * hidden, mlp[0]), nn.ReLU(), nn.Linear(mlp[0], mlp[1]), nn.ReLU(),
                                 nn.Linear(mlp[1], 1))

    # --- stepping API (decoding) ----------------------------------------------------------
    def start(self, pooled: torch.Tensor) -> ValueState:
        """s_0: the image alone (zero GRU state)."""
        image = self.image(pooled)
        return image, image.new_zeros(image.shape)

    def step(self, state: ValueState, words: torch.Tensor) -> ValueState:
        """s_{t+1} from s_t and the next word of every row (``words [N]``)."""
        image, h = state
        return image, self.rnn(self.words(words), h)

    def value(self, state: ValueState) -> torch.Tensor:
        """``[N]``: v(s) of every row."""
        image, h = state
        return self.mlp(torch.cat([image, h], dim=-1)).squeeze(-1)

    # --- whole captions (training) ---------------------------------------------------------
    def values(self, pooled: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``[N, T+1]``: v(s_t) for t = 0..T of each row of ``tokens [N, T]`` (one pooled row
        ``[N, D]`` per caption); column t is :meth:`value` after t :meth:`step` calls."""
        if pooled.shape[0] != tokens.shape[0]:
            raise CaprlError(f"ValueNetwork.values: {pooled.shape[0]} images for {tokens.shape[0]} captions")
        image, h = self.start(pooled)
        states = [h]
        for t in range(tokens.shape[1]):
            image, h = self.step((image, h), tokens[:, t])
            states.append(h)
        hidden = torch.stack(states, dim=1)  # [N, T+1, H]
        joined = torch.cat([image.unsqueeze(1).expand(-1, hidden.shape[1], -1), hidden], dim=-1)
        return self.mlp(joined).squeeze(-1)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """As nn.Module's, but weights of other sizes are a CaprlError naming both sizes and the run."""
        theirs = sizes_of_state(state_dict)
        if theirs is not None and theirs != self.sizes:
            raise CaprlError(
                f"{self.where}: the value network has value_hidden {self.sizes['value_hidden']}, value_mlp "
                f"{self.sizes['value_mlp']}, but the checkpoint it starts from has value_hidden "
                f"{theirs['value_hidden']}, value_mlp {theirs['value_mlp']}: set this run's value_hidden and "
                "value_mlp to those of the value run it starts from (init: {value: <run>})")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def sizes_of_state(state: Any) -> dict[str, Any] | None:
    """The sizes (value_hidden, value_mlp) of a value network's weights; None if not one."""
    try:
        return {"value_hidden": int(state["rnn.weight_hh"].shape[1]),
                "value_mlp": [int(state["mlp.0.weight"].shape[0]), int(state["mlp.2.weight"].shape[0])]}
    except (KeyError, IndexError, AttributeError):
        return None


def value_from_checkpoint(ckpt: checkpoint.Checkpoint, where: str = "checkpoint") -> ValueNetwork | None:
    """The checkpoint's value network (role ``value``), rebuilt from its record's options (the
    run's objective options: value_hidden, value_mlp) and the caption model's shape
    (vocabulary, pooled feature size); None if the checkpoint holds none."""
    if VALUE_ROLE not in ckpt.modules:
        return None
    record, model = ckpt.modules[VALUE_ROLE], ckpt.module(checkpoint.MODEL, where=where)
    options = record.options
    missing = [k for k in ("value_hidden", "value_mlp") if k not in options]
    if missing:
        raise CaprlError(f"{where}: its value network's record lacks option(s) {', '.join(missing)}")
    network = ValueNetwork(int(model.shape["vocab_size"]), int(model.shape["feat_dim"]), int(options["value_hidden"]),
                           list(options["value_mlp"]), where=where)
    network.load_state_dict(record.state)
    return network


def policy_samples(model: CaptionModel, batch: Batch, n: int, max_length: int) -> decoding.Samples:
    """``n`` captions per image sampled as actor-critic samples them (:mod:`caprl.objectives.actor_critic`:
    encode, then sample, in train mode with the batch's noise), but without gradient: the
    policy of the value pre-training is frozen. The model's mode is restored after."""
    was_training = model.training
    model.train()
    try:
        with torch.no_grad():
            ctx = model.encode(batch.pooled, batch.regions)
            return decoding.sample(model, ctx, max_length, n=n, noise=batch.noise)
    finally:
        model.train(was_training)


def embedding_reward(listener: Listener, tokens: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    """Eq. 6: ``[N]`` cosine of each caption's embedding (``tokens [N, T]``) and its image's
    (``pooled [N, D]``, one row per caption) = the diagonal of ``listener.similarity``, without
    gradient (row-wise, not the whole N x N matrix)."""
    with torch.no_grad():
        return (listener.embed_captions(tokens) * listener.embed_images(pooled)).sum(dim=-1)


@dataclass
class ValueOptions(Options):
    n_samples: int  # captions sampled per image
    reward: str  # the language reward mixed in (a name under `rewards:`), read when cider_weight > 0
    cider_weight: float  # R = (1 - w) * embedding reward + w * reward (paper: 0)
    value_hidden: int  # the value network's GRU, word embedding and image projection (paper: 512)
    value_mlp: list[int]  # the value MLP's two hidden sizes (paper: a three-layer perceptron, 512)

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str) -> "ValueOptions":
        options = super().from_dict(values, where)
        assert isinstance(options, ValueOptions)
        mlp = options.value_mlp
        if (not isinstance(mlp, list) or len(mlp) != 2
                or not all(isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in mlp)):
            raise CaprlError(f"{where}.value_mlp: expected a list of two positive integers (the MLP's hidden "
                             f"sizes), got {mlp!r}")
        if not 0.0 <= options.cider_weight <= 1.0:
            raise CaprlError(f"{where}.cider_weight: expected a number in [0, 1], got {options.cider_weight!r}")
        if options.value_hidden < 1 or options.n_samples < 1:
            key = "value_hidden" if options.value_hidden < 1 else "n_samples"
            raise CaprlError(f"{where}.{key}: expected a positive integer, got {getattr(options, key)!r}")
        options.where = where.removesuffix(".options")  # type: ignore[attr-defined]  # for errors, not an option
        return options


class EmbeddingRewardObjective(Objective):
    """An objective with a frozen embedding (role ``listener``) and a value network (role
    ``value``); it scores captions by the (mixed) embedding reward."""

    holds = ("listener", "value")
    Options = ValueOptions
    options: ValueOptions

    def __init__(self, options: ValueOptions, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__(options, env, model)
        self.listener = build_listener(env, model)
        self.listener.eval()
        feat_dim = int(env.extras.get("feat_dim", model.feat_dim))
        where = getattr(options, "where", "objective")
        self.value = ValueNetwork(model.vocab_size, feat_dim, options.value_hidden, options.value_mlp, where=where)

    def train(self, mode: bool = True) -> "EmbeddingRewardObjective":
        super().train(mode)
        self.listener.eval()  # frozen: always in eval mode
        return self

    def rewards(self, image_ids: Sequence[int], tokens: torch.Tensor, pooled: torch.Tensor,
                language: Any = None) -> torch.Tensor:
        """``[N]`` float32 R of each caption ``tokens [N, T]`` (``pooled [N, D]``, image ids one per
        caption): the embedding reward, mixed with ``cider_weight`` of the language reward
        (``language``: a reward function; default ``env.reward(reward)``)."""
        r = embedding_reward(self.listener, tokens, pooled).float()
        w = self.options.cider_weight
        if w > 0:
            language = self.env.reward(self.options.reward) if language is None else language
            scores = np.asarray(language(list(image_ids), self.env.decode_words(tokens)), dtype=np.float64)
            r = (1.0 - w) * r + w * self.tensor(scores, like=r)
        return r

    def value_mse(self, v: torch.Tensor, reward: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Eq. 9: mean over the sampled steps of (v(s_t) - R)^2 (``v``, ``mask [N, T]``, ``reward [N]``)."""
        return self.mean((v - reward.to(v.dtype).unsqueeze(1)) ** 2, mask)

    def sampled_values(self, batch: Batch, tokens: torch.Tensor, per_image: int) -> torch.Tensor:
        """``[N, T]``: v(s_t) before each word t of the sampled captions (the states the policy
        chose them in), the images' pooled rows repeated ``per_image`` times."""
        pooled = batch.pooled.repeat_interleave(per_image, dim=0)
        return self.value.values(pooled, tokens)[:, : tokens.shape[1]]


@register_objective("value")
class ValuePretraining(EmbeddingRewardObjective):
    """Eq. 9: the value network regressed on the frozen policy's sampled captions' rewards."""

    captioner = False
    select = "neg_value_mse"

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        return [{"params": list(self.value.parameters()), "lr": self.options.lr, "name": "value"}]

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        n = self.options.n_samples
        samples = policy_samples(model, batch, n, self.env.max_length)
        tokens, mask = samples.last_stage(), samples.mask[:, -1]
        ids = [i for i in batch.image_ids for _ in range(n)]
        reward = self.rewards(ids, tokens, batch.pooled.repeat_interleave(n, dim=0))
        loss = self.value_mse(self.sampled_values(batch, tokens, n), reward, mask)
        return loss, {"value_mse": float(loss.detach()), "reward_sample": float(reward.mean())}

    def validation(self, model: CaptionModel, data: Any) -> dict[str, float]:
        """MSE of v(s_t) on ``n_samples`` captions per val image, sampled as in training (train
        mode; fixed noise and dropout masks, so epochs compare). A mixed reward's language part
        is CIDEr-D against the val references (the trainer's rewards know the train references only)."""
        m = val_value_mse(self, model, data)
        return {"value_mse": m, "neg_value_mse": -m}


def val_value_mse(objective: EmbeddingRewardObjective, model: CaptionModel, data: Any) -> float:
    """The value network's MSE over the sampled steps of the val images' captions (:func:`policy_samples`:
    train mode, as actor-critic uses the value network; the dropout masks drawn from the
    ``seed``-seeded RNG inside a fork of it, so they are the same every epoch and the
    training's RNG state is as before)."""
    ids, n = data.split_ids("val"), objective.options.n_samples
    language = None
    if objective.options.cider_weight > 0:
        from caprl.rewards import build_reward

        language = build_reward("cider_d", data.references("val"), None)
    device = next(objective.value.parameters()).device
    seed = int(objective.env.extras.get("seed", 0))

    def compute() -> dict[str, float]:
        total, count = 0.0, 0.0
        torch.manual_seed(seed)  # the dropout masks (inside fork_rng below)
        for start in range(0, len(ids), VAL_BATCH):
            chunk = ids[start : start + VAL_BATCH]
            batch = data.batch(chunk).to(device)
            batch.noise = decoding.Noise(seed, step=-1, total=len(chunk))
            samples = policy_samples(model, batch, n, objective.env.max_length)
            tokens, mask = samples.last_stage(), samples.mask[:, -1]
            reward = objective.rewards([i for i in chunk for _ in range(n)], tokens,
                                       batch.pooled.repeat_interleave(n, dim=0), language)
            v = objective.sampled_values(batch, tokens, n)
            total += float((((v - reward.unsqueeze(1)) ** 2) * mask).sum())
            count += float(mask.sum())
        return {"mse": total / max(count, 1.0)}

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return in_eval_mode(objective.value, compute)["mse"]
