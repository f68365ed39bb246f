"""What a training job reads of params.yaml, resolved once into typed settings.

``caprl train`` builds one :class:`TrainSettings` per job (its run resolved by
:func:`caprl.params.run_spec`: ``objectives.<method>`` with the run's options on top, its
init, its decoding) and :func:`caprl.training.run.train` reads every value through it: the
loop's (:meth:`TrainSettings.loop`), the model's architecture and sizes, how validation
decodes, the listener's sizes, the MLflow experiment. The params dict itself still goes to
what builds a reward (``rewards.<name>``, and CLIP-S's embedding source), which resolve
their own sections. Every field is a params.yaml key the schema requires
(``workflow/schemas/params.schema.yaml``); no default lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from caprl import params as params_mod
from caprl.errors import CaprlError
from caprl.retrieval import ListenerConfig
from caprl.tracking import params_tags
from caprl.training.loop import LoopConfig

VALIDATE_WITH = ("evaluation", "greedy")


@dataclass(frozen=True)
class ModelSettings:
    """``models.<name>``: the registered architecture and its sizes (the rest of the entry)."""

    name: str
    arch: str
    sizes: dict[str, Any]

    def entry(self) -> dict[str, Any]:
        """The ``models.<name>`` entry as params.yaml writes it (arch first)."""
        return {"arch": self.arch, **self.sizes}


@dataclass(frozen=True)
class TrainSettings:
    dataset: str
    run: str
    spec: params_mod.RunSpec  # runs.<run>, resolved (method, options, init, decoding)
    model: ModelSettings
    seed: int
    gpus: int  # train.gpus: processes of a DDP group
    num_threads: int  # train.num_threads: torch's CPU threads (at least 1)
    batch_size: int  # train.batch_size: images per optimiser step (the global batch)
    grad_clip: float
    checkpoint_every: int
    log_every: int
    amp: str
    patience: int
    cuda_graphs: bool
    validate_with: str  # train.validate_with: evaluation | greedy
    max_length: int  # decode.max_length
    prefetch: int  # loading.prefetch
    experiment: str  # tracking.experiment
    tracking_tags: dict[str, str]  # tracking.tags (caprl.tracking.params_tags)
    listener: ListenerConfig | None  # listener: (paper 004's methods build theirs from it)
    # the sections as params.yaml has them: what the run's config hash and its MLflow record hold
    sections: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], dataset: str, run: str,
                    spec: params_mod.RunSpec | None = None) -> "TrainSettings":
        spec = spec or params_mod.run_spec(dict(params), run)
        if spec.model not in params["models"]:
            raise CaprlError(f"runs.{run}.model: '{spec.model}' is not defined under models: in params.yaml")
        entry = dict(params["models"][spec.model])
        arch = entry.pop("arch")
        t = params["train"]
        if t["validate_with"] not in VALIDATE_WITH:
            raise CaprlError(f"train.validate_with: {t['validate_with']!r} is not one of {', '.join(VALIDATE_WITH)}")
        reward = spec.options.get("reward")  # a REINFORCE objective's reward instance (rewards.<name>)
        return cls(dataset=dataset, run=run, spec=spec, model=ModelSettings(spec.model, arch, entry),
                   seed=int(params["seed"]), gpus=int(t["gpus"]), num_threads=max(1, int(t["num_threads"])),
                   batch_size=int(t["batch_size"]), grad_clip=float(t["grad_clip"]),
                   checkpoint_every=int(t["checkpoint_every"]), log_every=int(t["log_every"]), amp=str(t["amp"]),
                   patience=int(t["patience"]), cuda_graphs=bool(t["cuda_graphs"]),
                   validate_with=str(t["validate_with"]), max_length=int(params["decode"]["max_length"]),
                   prefetch=int(params["loading"]["prefetch"]), experiment=str(params["tracking"]["experiment"]),
                   tracking_tags=params_tags(params),
                   listener=ListenerConfig.from_dict(params["listener"]) if "listener" in params else None,
                   sections={"train": dict(t), "decode": dict(params["decode"]),
                             "reward": params["rewards"].get(reward) if reward else None,
                             "listener": params.get("listener"),
                             "dataset": params_mod.dataset_spec(dict(params), dataset)})

    def loop(self, epochs: int) -> LoopConfig:
        """The training loop's settings for an objective of ``epochs`` epochs."""
        return LoopConfig(epochs=epochs, batch_size=self.batch_size, grad_clip=self.grad_clip,
                          checkpoint_every=self.checkpoint_every, log_every=self.log_every,
                          max_length=self.max_length, seed=self.seed, amp=self.amp, prefetch=self.prefetch,
                          patience=self.patience, cuda_graphs=self.cuda_graphs)

    def validation_decode(self) -> dict[str, int]:
        """How validation decodes the captions it scores: ``beam_size`` (1: greedy) and ``max_length``.

        ``train.validate_with: evaluation`` (the default): the run's own evaluation decoding
        (``decode:`` with the run's ``decode:`` on top), so the checkpoint is chosen on the decoding
        its table row reports: an RL run is then compared with its XE start under the beam search
        that gives the start its beam gain, not greedy against greedy (lookahead, which needs the
        value network, is validated by the beam search of its width). ``greedy``:
        self-critical.pytorch's default (train.py validates with its ``beam_size``, 1 unless set)."""
        decode = self.spec.decode
        beam = 1 if self.validate_with == "greedy" or decode["method"] == "greedy" else int(decode["beam_size"])
        return {"beam_size": beam, "max_length": int(decode["max_length"])}
