"""Training methods (objectives), by name.

An objective turns a batch into a loss. It is an ``nn.Module``: the modules it brings
(a baseline MLP, a value network, a listener) are its children, so the trainer moves them
to the device, optimises them with the learning rates of :meth:`Objective.param_groups`,
clips, checkpoints, resumes and DDP-syncs them with the caption model. It gets what it
needs from an :class:`ObjectiveEnv` (vocabulary, rewards by name, decoding settings) and
knows nothing of the trainer, so a new method is one class here plus one entry under
``objectives:`` in params.yaml.

Options are typed: each objective declares an ``Options`` dataclass whose fields have no
defaults (every default lives in params.yaml); an unknown or mistyped option is an error
naming the run and the key.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from caprl import decoding
from caprl.decoding import captured
from caprl.decoding.constraints import Constraints, Rule
from caprl.data.batch import Batch
from caprl.decoding import Samples
from caprl.errors import CaprlError
from caprl.models.base import CaptionModel
from caprl.objectives.init_optimizer import INIT_OPTIMIZERS
from caprl.objectives.schedules import LR_SCHEDULES
from caprl.registry import Registry

__all__ = ["Batch", "GREEDY_MODES", "GreedyMode", "Objective", "ObjectiveEnv", "Options", "OBJECTIVES",
           "build_objective", "one_of", "register_objective"]


class RewardFn(Protocol):
    def __call__(self, image_ids: Sequence[int], captions: Sequence[Sequence[str]]) -> np.ndarray: ...


@dataclass
class ObjectiveEnv:
    """What an objective may use besides the model and the batch."""

    decode_words: Callable[[torch.Tensor], list[list[str]]]  # [N, T] token ids -> words
    reward: Callable[[str], RewardFn]  # reward by its name under `rewards:` in params.yaml, built once
    max_length: int
    global_sum: Callable[[torch.Tensor], torch.Tensor] = lambda x: x  # sum over DDP processes
    world_size: int = 1
    extras: dict[str, Any] = field(default_factory=dict)


def one_of(choices: Callable[[], Iterable[str]], default: Any = dataclasses.MISSING) -> Any:
    """An option field whose value must be a name of ``choices()`` (a registry, read when checked:
    the registry is the one list of its names). Use as ``variant: str = one_of(lambda: VARIANTS)``.
    A ``default`` (only for an option that switches a later addition off) makes it keyword-only."""
    if default is dataclasses.MISSING:
        return field(metadata={"choices": choices})
    return field(default=default, kw_only=True, metadata={"choices": choices})


@dataclass
class Options:
    """Options every method reads; subclasses add theirs (no defaults: params.yaml has them, but
    for an option that switches a later addition off, e.g. XE's scheduled sampling)."""

    lr: float
    epochs: int
    lr_decay_every: int  # step decay: every group's rate times lr_decay_rate every this many epochs (0: none)
    lr_decay_rate: float
    # the rate's schedule, a name of caprl.objectives.schedules.LR_SCHEDULES (step: the decay above;
    # noam: SCP's NoamOpt, for the transformer), and noam's warm-up steps and factor (SCP's
    # noamopt_warmup of configs/transformer/transformer.yml and opts.py's noamopt_factor)
    lr_schedule: str = one_of(lambda: LR_SCHEDULES, default="step")
    noam_warmup: int = field(default=20000, kw_only=True)
    noam_factor: float = field(default=1.0, kw_only=True)
    # Adam's moments and epsilon (torch's and SCP opts.py's optim_alpha / optim_beta / optim_epsilon
    # defaults; SCP's NoamOpt builds its Adam with 0.9 / 0.98 / 1e-9, misc.py get_std_opt)
    adam_beta1: float = field(default=0.9, kw_only=True)
    adam_beta2: float = field(default=0.999, kw_only=True)
    adam_eps: float = field(default=1e-8, kw_only=True)
    # where a run with an init starts its Adam, a name of caprl.objectives.init_optimizer.INIT_OPTIMIZERS:
    # carry (the init checkpoints' moments; SCP's tools/train.py --start_from) | fresh (caprl's former)
    init_optimizer: str = one_of(lambda: INIT_OPTIMIZERS, default="fresh")

    @property
    def adam(self) -> dict[str, Any]:
        """The optimiser's keyword arguments these options set (torch.optim.Adam's betas, eps)."""
        return {"betas": (self.adam_beta1, self.adam_beta2), "eps": self.adam_eps}

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str) -> "Options":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise CaprlError(f"{where}: unknown option(s) {', '.join(unknown)}; this method takes "
                             f"{', '.join(sorted(fields))}")
        missing = sorted(name for name, f in fields.items() if name not in values
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        if missing:
            raise CaprlError(f"{where}: option(s) {', '.join(missing)} missing (set them under objectives: "
                             "in params.yaml or in the run's options)")
        hints = typing.get_type_hints(cls)
        for name, value in values.items():
            if not _fits(value, hints[name]):
                raise CaprlError(f"{where}.{name}: expected {_type_name(hints[name])}, got {value!r}")
            choices = fields[name].metadata.get("choices")
            if choices is not None and value not in list(choices()):
                raise CaprlError(f"{where}.{name}: expected one of {', '.join(choices())}, got {value!r}")
        options = cls(**{k: (float(v) if hints[k] is float else v) for k, v in values.items()})
        if options.lr_decay_every < 0:
            raise CaprlError(f"{where}.lr_decay_every: expected a number of epochs >= 0 (0: no decay), "
                             f"got {options.lr_decay_every}")
        if options.lr_decay_rate <= 0:
            raise CaprlError(f"{where}.lr_decay_rate: expected a positive factor, got {options.lr_decay_rate}")
        if options.noam_warmup < 1 or options.noam_factor <= 0:
            key = "noam_warmup" if options.noam_warmup < 1 else "noam_factor"
            raise CaprlError(f"{where}.{key}: expected a positive number, got {getattr(options, key)!r}")
        for key in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(options, key) < 1:
                raise CaprlError(f"{where}.{key}: expected a number in [0, 1), got {getattr(options, key)!r}")
        if options.adam_eps <= 0:
            raise CaprlError(f"{where}.adam_eps: expected a positive number, got {options.adam_eps!r}")
        if options.lr_schedule != "step" and options.lr_decay_every != 0:
            raise CaprlError(f"{where}.lr_decay_every: the step decay is lr_schedule step's; under "
                             f"{options.lr_schedule} it must be 0, got {options.lr_decay_every}")
        options.check(where)
        return options

    def check(self, where: str) -> None:
        """Checks across options (subclasses add theirs; errors name the key under ``where``)."""

    def lr_scale(self, epoch: int, step: int = 0, d_model: int | None = None) -> float:
        """The factor on every group's rate before optimiser step ``step`` (0-based) of (0-based)
        ``epoch``, by ``lr_schedule`` (:mod:`caprl.objectives.schedules`; ``d_model``: the model's, for
        noam): a pure function of the position (a resumed run gets the same rates). ``step``:
        ``lr_decay_rate ** (epoch // lr_decay_every)``, self-critical.pytorch's
        learning_rate_decay_every / _rate (x0.8 every 3 epochs), from epoch 0."""
        return LR_SCHEDULES.get(self.lr_schedule, where="lr_schedule")(self, epoch, step, d_model)


@dataclass(frozen=True)
class GreedyMode:
    """How a self-critical objective decodes the greedy captions its baseline reads (option
    ``greedy_mode``, a name of :data:`GREEDY_MODES`); always without gradient. ``training``: the
    model's mode for the greedy pass (True: dropout on in the encoder, the feature embedding and
    the decoder, fresh masks; False: none); ``own_encoding``: the images encoded again for it
    (False: decoded from the samples' train-mode encoding)."""

    training: bool
    own_encoding: bool


GREEDY_MODES: Registry[GreedyMode] = Registry("greedy baseline mode")
# self-critical.pytorch, captioning/modules/loss_wrapper.py LossWrapper.forward (sc_flag):
# model.eval(); with torch.no_grad(): the greedy caption (model(..., mode='sample') encodes the
# features again); model.train(); then the samples
GREEDY_MODES.add("eval", GreedyMode(training=False, own_encoding=True))
# the authors' code of papers 000 and 004 (Stack-Captioning misc/rewards.py get_self_critical_reward;
# DiscCaptioning models/JointModel.py forward; CooperativeImageCaptioning models/AlternatingJointModel.py
# greedy_baseline, greedy_res_for_cider): model.sample(..., sample_max 1) with no .eval() before it,
# the model in train mode since train.py's model.train()
GREEDY_MODES.add("train", GreedyMode(training=True, own_encoding=True))
# caprl's former decode (no source): the samples' train-mode encoding, the decoder in eval mode
GREEDY_MODES.add("shared", GreedyMode(training=False, own_encoding=False))


def _fits(value: Any, hint: Any) -> bool:
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool):
        return isinstance(value, hint)
    return True  # containers: checked by the objective where it matters


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


class Objective(nn.Module):
    """Subclasses set ``Options`` and implement ``loss`` (or ``turns`` and ``turn_loss``); their
    child modules are trained too."""

    Options: type[Options] = Options
    name: str = ""
    #: True if a run of this method yields a caption model (evaluated, in the tables)
    captioner: bool = True
    #: roles of the objective's own modules (:meth:`modules_to_save`), besides the caption model:
    #: what a run of the method can start from another run (``init``) and what its checkpoint holds
    holds: tuple[str, ...] = ()
    #: roles of the frozen modules the objective makes itself from the start (a KL anchor's reference
    #: policy, :mod:`caprl.objectives.policy`): checkpointed and resumed with the rest, never an init role
    keeps: tuple[str, ...] = ()
    #: validation metric that picks the best epoch (a key of the validator's output)
    select: str = "CIDEr-D"
    #: True if the method trains or holds a listener (role ``listener``): its runs get a retrieval evaluation
    retrieval: bool = False
    #: True if the method pre-trains a listener alone (no caption model to evaluate): the workflow
    #: scores its listener on the evaluation split's gold captions (``caprl retrieval --gold``)
    gold_retrieval: bool = False
    #: Alternating updates (paper 004's REINFORCE joint training: the speaker, then the listener,
    #: each with the other frozen). Empty: one update per batch on :meth:`loss`. Else the trainer
    #: makes one full update (zero_grad, backward, clip, optimiser step) per turn, in this order,
    #: on the same batch, from :meth:`turn_loss`; a turn moves only the parameters its loss
    #: reaches (Adam skips those whose gradient is None). Decode a frozen module under
    #: ``torch.no_grad``: a recorded use of a time-shared layer whose backward never runs is an error.
    turns: tuple[str, ...] = ()

    def __init__(self, options: Options, env: ObjectiveEnv, model: CaptionModel) -> None:
        super().__init__()
        self.options = options
        self.env = env

    def begin(self, model: CaptionModel) -> None:
        """Called once ``model`` holds its starting weights (its ``init``, loaded), before a resume
        restores a saved state: an objective that keeps a frozen copy of the start (a KL anchor's
        reference policy, :mod:`caprl.objectives.policy`) takes it here. Nothing by default."""

    def loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def fixed_step(self, batch: Batch) -> bool:
        """True if :meth:`fixed_loss` computes this batch's loss: shapes fixed by the batch's and
        nothing read back from the device, so that a CUDA graph can capture the whole step
        (:mod:`caprl.training.graphs`). False (the default) where the method cannot (its rewards are
        scored on the host, its decode ends early): the trainer then steps eagerly."""
        return False

    def fixed_loss(self, model: CaptionModel, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`loss` as :meth:`fixed_step` promises it, its metrics as tensors."""
        raise NotImplementedError(f"objective {self.name or type(self).__name__} has no fixed-shape loss")

    def turn_loss(self, model: CaptionModel, batch: Batch, turn: str) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one of :attr:`turns` (objectives with turns implement this, not :meth:`loss`)."""
        raise NotImplementedError(f"objective {self.name or type(self).__name__} has no turn '{turn}'")

    def validation(self, model: CaptionModel, data: Any) -> dict[str, float]:
        """Validation metrics of the objective's own (at epoch end, eval mode is the objective's
        to set): a listener's recall, a value network's error. Captioners' methods get the
        caption metrics (validation CIDEr-D) from the trainer and need none."""
        return {}

    def param_groups(self, model: CaptionModel) -> list[dict[str, Any]]:
        """Optimiser groups: the caption model at ``lr``; subclasses add their modules' groups.
        A module with no group is frozen (the objective keeps it in eval mode)."""
        return [{"params": list(model.parameters()), "lr": self.options.lr, "name": "model"}]

    def modules_to_save(self) -> dict[str, nn.Module]:
        """The objective's own modules, by role name (checkpointed, restored, init-able)."""
        return dict(self.named_children())

    def greedy_and_samples(self, model: CaptionModel, batch: Batch, n: int, temperature: float = 1.0,
                           keep_entropy: bool = False, greedy: bool = True) -> tuple[Samples | None, Samples]:
        """Self-critical decoding: ``n`` samples per image (train mode, differentiable) and the
        greedy captions (:meth:`greedy_captions`; None, not decoded, if not ``greedy``: a baseline
        that does not read them). The samples come first (the order of the authors' code), so
        they draw the same dropout masks whatever the greedy pass does."""
        model.train()
        ctx = model.encode(batch.pooled, batch.regions)
        samples = decoding.sample(model, ctx, self.env.max_length, n=n, temperature=temperature, noise=batch.noise,
                                  keep_entropy=keep_entropy, rule=self.sampling_rule())
        return (self.greedy_captions(model, batch, ctx) if greedy else None), samples

    def sampling_rule(self) -> Rule | None:
        """With option ``remove_bad_endings`` (off by default), the RL samples never end on one of
        self-critical.pytorch's bad endings (:data:`caprl.decoding.constraints.BAD_ENDINGS`), as its
        decoding flag does at test time. Caveat: the policy that samples (and whose log-probabilities
        the gradient reads) is then the constrained, renormalised one, not the model's own."""
        if not getattr(self.options, "remove_bad_endings", False):
            return None
        words = self.env.extras.get("words")
        if words is None:
            raise CaprlError(f"{self.name}.remove_bad_endings: the objective was not given the vocabulary's words "
                             "(ObjectiveEnv.extras['words'])")
        return Constraints.of(False, True, False, words).rule()

    def greedy_captions(self, model: CaptionModel, batch: Batch, ctx: Any) -> Samples:
        """The greedy caption of every image of ``batch``, without gradient, decoded as option
        ``greedy_mode`` says (:data:`GREEDY_MODES`; the option is :class:`~caprl.objectives.baselines.
        BaselineOptions`'); ``ctx``: the samples' train-mode encoding, which ``shared`` decodes from.
        In eval mode the decode is replayed from a CUDA graph on a GPU (:mod:`caprl.decoding.captured`);
        in train mode it runs eagerly (its dropout masks are new draws). Eval mode draws no random
        numbers; train mode draws the masks from the global RNG (after the samples'). The model is
        left in train mode."""
        name = self.options.greedy_mode  # type: ignore[attr-defined]  # every reader's options have it
        mode = GREEDY_MODES.get(name, where=f"{self.name}.greedy_mode")
        length = self.env.max_length

        def decode(c: Any) -> Samples:
            return decoding.sample(model, c, length, greedy=True)

        model.train(mode.training)
        try:
            with torch.no_grad():
                own = model.encode(batch.pooled, batch.regions) if mode.own_encoding else ctx
                return decode(own) if mode.training else captured.run(model, ("greedy", length), decode, own)
        finally:
            model.train()

    def mean(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked mean over the GLOBAL batch: with DDP (gradients averaged over processes)
        each process divides its sum by the global count, so the gradient is exactly the
        one-process gradient whatever the split."""
        count = self.env.global_sum(mask.sum().detach()).clamp(min=1.0)
        return (values * mask).sum() * self.env.world_size / count

    def tensor(self, values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
        """Host numbers (rewards) as a tensor on the device and dtype of ``like``."""
        return torch.as_tensor(np.asarray(values), dtype=like.dtype, device=like.device)


OBJECTIVES: Registry[type[Objective]] = Registry("objective")


def register_objective(name: str) -> Callable[[type[Objective]], type[Objective]]:
    return OBJECTIVES.register_class(name)


def build_objective(method: str, options: dict[str, Any], env: ObjectiveEnv, model: CaptionModel,
                    where: str = "objective") -> Objective:
    """Instantiate method ``method`` with its options checked (errors name ``where``, e.g. the run)."""
    cls = OBJECTIVES.get(method, where=f"{where}.method")
    return cls(cls.Options.from_dict(dict(options), where=f"{where}.options"), env, model)
